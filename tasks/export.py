"""Export a run folder as a Hugging Face dataset: Parquet shards under ``data/`` plus ``README.md``.

``export_run(run_dir, out_dir)`` streams the rows twice with bounded memory:

1. every row (``trajectories.jsonl``; with ``include="all"`` also the hallucinated-tool rows of
   the batch files, found through :class:`tasks.run_index.RunIndex`) is redacted
   (:func:`hermes_core.redaction.redactor`), converted (``messages`` format:
   :func:`hermes_core.sharegpt_parse.to_chat_messages`) and appended to a temp NDJSON file
   while the schema is inferred chunk by chunk (:mod:`tasks.hf_schema`);
2. the temp file is cut into shards of ~``shard_bytes`` of JSON, each read by polars with the
   one merged schema and written as ``data/train-XXXXX-of-YYYYY.parquet``.

The card (:mod:`tasks.dataset_card`) declares the features, so ``datasets.load_dataset(out_dir)``
gives the same columns and types as ``load_dataset("json", data_files=trajectories.jsonl)``
(``metadata.timestamp`` is stored as text and declared ``timestamp[s]``, as the JSON loader
reads it; empty objects are stored as JSON text and declared ``json``).
"""

from __future__ import annotations

import heapq
import json
import re
import shutil
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from hermes_core.redaction import redactor
from hermes_core.sharegpt_parse import TurnFormatError, to_chat_messages
from tasks._files import atomic_writer, iter_raw_lines, line_chunks, loads_object
from tasks.dataset_card import render_card
from tasks.hf_schema import features_yaml, finalise, force_json, merge_dtypes
from tasks.run_index import RunIndex
from tasks.run_summary import read_summary

__all__ = ["FORMATS", "INCLUDES", "ExportError", "ExportResult", "export_run", "messages_row"]

FORMATS = ("sharegpt", "messages")
INCLUDES = ("kept", "all")
SHARD_BYTES = 64 << 20  # JSON bytes per Parquet shard (~10-20 MB of Parquet)
_INFER_BYTES = 4 << 20  # JSON bytes per schema-inference chunk
_TMP = ".export-rows.jsonl"
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


class ExportError(ValueError):
    """The export cannot be made (the message names the file or option)."""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_run` wrote.

    Attributes:
        out_dir: the dataset folder.
        rows: rows exported.
        filtered_included: of which rows of hallucinated-tool samples (``include="all"``).
        shards: the Parquet files, in order.
        card: the ``README.md``.
    """

    out_dir: Path
    rows: int
    filtered_included: int
    shards: list[Path]
    card: Path


def messages_row(row: dict[str, Any]) -> dict[str, Any]:
    """A ShareGPT row as a chat-messages row: ``prompt_index, prompt_id, model, completed, partial,
    messages, tools`` (see :func:`hermes_core.sharegpt_parse.to_chat_messages`).

    Raises:
        hermes_core.sharegpt_parse.TurnFormatError: a turn is not in the converter's form.
    """
    messages, tools = to_chat_messages(row.get("conversations") or [])
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    return {
        "prompt_index": row.get("prompt_index"),
        "prompt_id": metadata.get("prompt_id"),
        "model": metadata.get("model"),
        "completed": row.get("completed"),
        "partial": row.get("partial"),
        "messages": messages,
        "tools": tools,
    }


def _kept_rows(path: Path) -> Iterator[tuple[int, bool, str, dict[str, Any]]]:
    """``(prompt_index, False, origin, row)`` of every row of trajectories.jsonl (already in order)."""
    for _, raw, line_no, _last in iter_raw_lines(path):
        row = loads_object(raw)
        if row is None:
            raise ExportError(f"{path} line {line_no}: not a JSON object")
        yield row.get("prompt_index", -1), False, f"{path} line {line_no}", row


def _filtered_rows(
    run_dir: Path, valid_tools: Collection[str]
) -> Iterator[tuple[int, bool, str, dict[str, Any]]]:
    """``(prompt_index, True, origin, row)`` of the rows left out of the merge for a hallucinated tool,
    by prompt_index, with ``tool_stats`` / ``tool_error_counts`` cut to the registry's tools."""
    tools = set(valid_tools)
    index = RunIndex.open(run_dir, valid_tools=valid_tools)
    for entry in index.table.filter(pl.col("status") == "filtered").iter_rows(named=True):
        row = index.row(entry)
        row["prompt_index"] = entry["prompt_index"]
        for key in ("tool_stats", "tool_error_counts"):
            if isinstance(row.get(key), dict):
                row[key] = {name: value for name, value in row[key].items() if name in tools}
        yield entry["prompt_index"], True, f"{run_dir / entry['file']} byte {entry['offset']}", row


def _prepare_out(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"--out {out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not overwrite:
            raise ExportError(f"--out {out_dir}: folder is not empty (pass --overwrite to replace an export)")
        shutil.rmtree(out_dir / "data", ignore_errors=True)
        for name in ("README.md", _TMP):
            (out_dir / name).unlink(missing_ok=True)
    (out_dir / "data").mkdir(parents=True, exist_ok=True)


def export_run(
    run_dir: Path,
    out_dir: Path,
    *,
    valid_tools: Collection[str],
    fmt: str = "sharegpt",
    include: str = "kept",
    license: str | None = None,
    overwrite: bool = False,
    shard_bytes: int = SHARD_BYTES,
) -> ExportResult:
    """Write ``out_dir/data/train-*.parquet`` and ``out_dir/README.md`` from a finished run.

    Args:
        run_dir: the run folder (needs ``trajectories.jsonl``; run.json and statistics.json feed the card).
        out_dir: the dataset folder (created; must be empty unless ``overwrite``, which replaces
            ``data/`` and ``README.md`` only).
        valid_tools: the registry's tool names (for ``include="all"``).
        fmt: ``sharegpt`` (rows as in trajectories.jsonl) or ``messages`` (:func:`messages_row`).
        include: ``kept`` (trajectories.jsonl) or ``all`` (also the hallucinated-tool rows).
        license: the card's license id (None: ``other``).
        overwrite: replace an earlier export in ``out_dir``.
        shard_bytes: JSON bytes per shard.

    Raises:
        ExportError: no trajectories.jsonl, no row, a malformed row or turn (naming the file and
            line), an unknown format/include, or a non-empty ``out_dir``.
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if include not in INCLUDES:
        raise ExportError(f"--include {include}: expected one of {', '.join(INCLUDES)}")
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    merged = run_dir / "trajectories.jsonl"
    if not merged.is_file():
        raise ExportError(
            f"{merged}: not found (the run has not been merged yet: let it finish or --resume it)"
        )
    try:
        summary = read_summary(run_dir)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    _prepare_out(out_dir, overwrite)

    sources = [_kept_rows(merged)]
    if include == "all":
        sources.append(_filtered_rows(run_dir, valid_tools))
    scrub = redactor().redact_obj
    schema: dict[str, pl.DataType] = {}
    rows = filtered = 0
    timestamps_ok = True
    tmp = out_dir / _TMP
    chunk: list[bytes] = []
    size = 0

    def infer() -> None:
        nonlocal schema
        found = pl.read_ndjson(b"".join(chunk), infer_schema_length=None).schema
        for name, dtype in found.items():
            schema[name] = merge_dtypes(schema[name], dtype) if name in schema else dtype

    with open(tmp, "wb") as fh:
        for _, was_filtered, origin, row in heapq.merge(*sources, key=lambda item: item[0]):
            filtered += was_filtered
            row = scrub(row)
            if fmt == "messages":
                try:
                    row = messages_row(row)
                except TurnFormatError as exc:
                    raise ExportError(f"{origin}: {exc}") from None
            else:
                stamp = (row.get("metadata") or {}).get("timestamp")
                timestamps_ok &= isinstance(stamp, str) and _TIMESTAMP.fullmatch(stamp) is not None
            line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
            fh.write(line)
            chunk.append(line)
            size += len(line)
            rows += 1
            if size >= _INFER_BYTES:
                infer()
                chunk, size = [], 0
        if chunk:
            infer()
    if rows == 0:
        tmp.unlink()
        raise ExportError(f"{merged}: no rows to export")

    overrides = {}
    if fmt == "messages":
        schema = force_json(schema, ["tools", "[]", "function", "parameters"])
    elif timestamps_ok:
        overrides["metadata.timestamp"] = "timestamp[s]"
    storage = finalise(schema)
    parts = []
    for number, data in enumerate(line_chunks(tmp, shard_bytes)):
        part = out_dir / "data" / f".part-{number:05d}.parquet"
        with atomic_writer(part) as out:
            pl.read_ndjson(data, schema=storage).write_parquet(out)
        parts.append(part)
    tmp.unlink()
    shards = []
    for number, part in enumerate(parts):
        final = out_dir / "data" / f"train-{number:05d}-of-{len(parts):05d}.parquet"
        part.rename(final)
        shards.append(final)

    card = out_dir / "README.md"
    text = render_card(
        summary,
        fmt=fmt,
        include=include,
        rows=rows,
        filtered_included=filtered,
        features=features_yaml(schema, overrides),
        data_glob="data/train-*.parquet",
        license=license,
    )
    with atomic_writer(card) as out:
        out.write(text.encode("utf-8"))
    return ExportResult(out_dir=out_dir, rows=rows, filtered_included=filtered, shards=shards, card=card)
