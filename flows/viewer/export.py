"""Export a run folder as a Hugging Face dataset: Parquet shards under ``data/`` plus ``README.md``.

``export_run(run_dir, out_dir)`` streams the rows twice with bounded memory:

1. every row (``trajectories.jsonl``, or with ``compressed`` ``trajectories_compressed.jsonl``,
   the rows ``hermes-batch compress`` wrote: ``kept`` all of them, ``passed`` those whose
   ``metadata.passed`` is true, ``all`` refused; with ``include="all"`` also the hallucinated-tool rows of
   the batch files, found through :class:`flows.viewer.index.RunIndex`; with ``include="passed"``
   only the rows whose ``metadata.passed`` is true) gets the newest re-scores of ``scores.jsonl``
   (:func:`hermes_core.runfolder.rescores.apply_rescore`, as the merge lays them), is redacted
   (:func:`hermes_core.redaction.redactor`), converted (``messages`` format:
   :func:`hermes_core.sharegpt_parse.to_chat_messages`) and appended to a temp NDJSON file
   while the schema is inferred chunk by chunk (:mod:`flows.viewer.hf_schema`);
2. the temp file is cut into shards of ~``shard_bytes`` of JSON, each read by polars with the
   one merged schema and written as ``data/train-XXXXX-of-YYYYY.parquet``.

What ``out_dir`` may be, and what ``overwrite`` deletes (nothing that an export did not write):

* ``out_dir`` is refused when it is ``/`` or a home folder; when it is, holds or lies inside the
  run folder, another run folder (a folder with ``run.json``, ``checkpoint.json`` or the ledger's
  index) or an output folder (the run folder's parent, and the given ``output_dirs``); when it is
  the current folder and no export made it; when it exists and is not a folder.
* every export writes :data:`MANIFEST` into ``out_dir`` first and keeps it up to date: it lists
  each file before the file is made (so a killed export is listed too), the folders the export
  made (``data``) and the run it came from.
* a non-empty ``out_dir`` is used only with ``overwrite`` and only when it holds a valid manifest
  and nothing else than the files and folders it lists: those files are deleted (then the empty
  folders), everything else is left and the export is refused, naming what is in the way. A
  manifest entry that is not a name an export writes (``README.md``, ``data/train-*.parquet``,
  its temp files) refuses the export: nothing is deleted.

Every refusal is an :class:`ExportError` raised before anything is written or deleted.

The card (:mod:`flows.viewer.dataset_card`) declares the features, so ``datasets.load_dataset(out_dir)``
gives the same columns and types as ``load_dataset("json", data_files=trajectories.jsonl)``
(``metadata.timestamp`` is stored as text and declared ``timestamp[s]``, as the JSON loader
reads it; empty objects are stored as JSON text and declared ``json``). Scores keep fixed types
(:func:`flows.viewer.hf_schema.type_scores`: ``metadata.score`` a struct of one struct
``{value: float64, passed: bool, explanation: string}`` per scorer, ``metadata.passed`` bool,
``metadata.sample_index`` int64; top-level ``score``, ``passed``, ``sample_index`` in the
``messages`` format).
"""

from __future__ import annotations

import heapq
import json
import os
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from flows.viewer import compression as compression_info
from flows.viewer.dataset_card import render_card
from flows.viewer.hf_schema import features_yaml, finalise, force_json, merge_dtypes, type_scores
from flows.viewer.index import RunIndex
from hermes_core.environments.workdir import home_folders
from hermes_core.redaction import redactor
from hermes_core.runfolder.files import (
    atomic_writer,
    iter_raw_lines,
    line_chunks,
    loads_object,
    write_json_atomic,
)
from hermes_core.runfolder.folder import CHECKPOINT_FILE, LEDGER_INDEX_FILE, RUN_FILE, RunFolder
from hermes_core.runfolder.rescores import apply_rescore, read_rescores
from hermes_core.runfolder.summary import RunSummary, read_summary
from hermes_core.sharegpt_parse import TurnFormatError, to_chat_messages

__all__ = [
    "FORMATS",
    "INCLUDES",
    "MANIFEST",
    "ExportError",
    "ExportResult",
    "export_run",
    "is_run_folder",
    "messages_row",
]

FORMATS = ("sharegpt", "messages")
INCLUDES = ("kept", "all", "passed")
SHARD_BYTES = 64 << 20  # JSON bytes per Parquet shard (~10-20 MB of Parquet)
_INFER_BYTES = 4 << 20  # JSON bytes per schema-inference chunk
_TMP = ".export-rows.jsonl"
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
MANIFEST = ".hermes-export.json"
"""The export folder's manifest: ``{"made_by", "run": {run_name, run_id}, "format", "include",
"compressed", "complete", "files": [relative paths], "folders": ["data"]}``."""
_EXPORT_NAMES = re.compile(
    r"README\.md|\.export-rows\.jsonl|data/train-\d{5}-of-\d{5}\.parquet|data/\.part-\d{5}\.parquet"
)
_EXPORT_FOLDERS = ("data",)
_RUN_MARKERS = (RUN_FILE, CHECKPOINT_FILE, LEDGER_INDEX_FILE)
_SCAN_LIMIT = 10_000  # entries looked at when searching --out for run folders
_SHOWN = 8  # names listed in a refusal


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
    messages, tools`` (see :func:`hermes_core.sharegpt_parse.to_chat_messages`), then ``sample_index``,
    ``score`` and ``passed`` when the row's metadata has them.

    Raises:
        hermes_core.sharegpt_parse.TurnFormatError: a turn is not in the converter's form.
    """
    messages, tools = to_chat_messages(row.get("conversations") or [])
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    out = {
        "prompt_index": row.get("prompt_index"),
        "prompt_id": metadata.get("prompt_id"),
        "model": metadata.get("model"),
        "completed": row.get("completed"),
        "partial": row.get("partial"),
        "messages": messages,
        "tools": tools,
    }
    out.update({key: metadata[key] for key in ("sample_index", "score", "passed") if key in metadata})
    return out


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


def is_run_folder(folder: Path) -> bool:
    """True when ``folder`` holds a run's ``run.json``, ``checkpoint.json`` or ledger index."""
    return any(os.path.isfile(os.path.join(folder, name)) for name in _RUN_MARKERS)


def _names(names: Iterable[str]) -> str:
    """``a, b, c`` (sorted; at most :data:`_SHOWN`, then ``and N more``)."""
    names = sorted(names)
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _run_folders_below(out: Path) -> Iterator[Path]:
    """Run folders among the sub-folders and sub-sub-folders of ``out`` (links not followed; at
    most :data:`_SCAN_LIMIT` entries are looked at: deeper or further ones are caught by the
    rule that a non-export folder is never written to)."""
    seen = 0
    level = [out]
    for _depth in range(2):
        below = []
        for folder in level:
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > _SCAN_LIMIT:
                            return
                        if entry.is_dir(follow_symlinks=False):
                            path = Path(entry.path)
                            if is_run_folder(path):
                                yield path
                            below.append(path)
            except OSError:
                continue
        level = below


def _place_problem(out_dir: Path, run_dir: Path, output_dirs: Iterable[Path]) -> str | None:
    """Why ``out_dir`` may not hold an export at all (before anything in it is looked at), or None."""
    out = Path(os.path.realpath(out_dir))
    if out == Path("/"):
        return "is the root folder: choose a folder inside it"
    if str(out) in home_folders():
        return "is a home folder: choose a folder inside it"
    protected: dict[Path, tuple[str, Path]] = {}
    parent = Path(os.path.normpath(os.path.join(run_dir, os.pardir)))  # "data" of data/demo, ".." of .
    for folder in parent, *output_dirs:
        protected.setdefault(Path(os.path.realpath(folder)), ("output folder", Path(folder)))
    protected[Path(os.path.realpath(run_dir))] = ("run folder", Path(run_dir))
    runs = [real for real, (label, _) in protected.items() if label == "run folder"]
    outputs = [real for real in protected if real not in runs]
    relations = [
        *((real, "is") for real in protected if out == real),
        *((real, "lies inside") for real in runs + outputs if out.is_relative_to(real)),
        *((real, "holds") for real in outputs + runs if real.is_relative_to(out) and real.exists()),
    ]
    found = None
    if relations:
        real, verb = relations[0]
        label, shown = protected[real]
        found = f"{verb} the {label} {shown}" + (
            " (where run folders live)" if label == "output folder" else ""
        )
    else:
        inside = next((p for p in (out, *out.parents) if is_run_folder(p)), None)
        if inside is not None:
            found = f"{'is' if inside == out else 'lies inside'} the run folder {inside}"
        elif out.is_dir():
            below = next(_run_folders_below(out), None)
            if below is not None:
                found = f"holds the run folder {Path(out_dir) / below.relative_to(out)}"
    if found:
        return f"{found}: nothing was written or deleted; choose a folder outside it"
    if out == Path(os.path.realpath(os.getcwd())) and not (out / MANIFEST).is_file():
        return (
            f"is the current folder and no export made it (no {MANIFEST}): nothing was written or "
            "deleted; choose another folder"
        )
    if os.path.lexists(out_dir) and not out.is_dir():
        return "exists and is not a folder"
    return None


def _read_manifest(out_dir: Path) -> dict[str, Any]:
    """The manifest of an export folder, checked: every entry is a name an export writes.

    Raises:
        ExportError: it is missing, not a regular file, not valid JSON, or names another file.
    """
    path = out_dir / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise ExportError(f"{path} is not a file an export wrote: nothing was deleted")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise ExportError(f"{path} is not valid JSON ({exc}): nothing was deleted") from None
    if not isinstance(manifest, dict):
        raise ExportError(f"{path} is not valid JSON (not an object): nothing was deleted")
    files, folders = manifest.get("files", []), manifest.get("folders", [])
    if not isinstance(files, list) or not isinstance(folders, list):
        raise ExportError(f"{path}: files and folders must be lists: nothing was deleted")
    for name in files:
        if not isinstance(name, str) or not _EXPORT_NAMES.fullmatch(name):
            raise ExportError(f"{path} lists {name!r}, not a file an export writes: nothing was deleted")
    for name in folders:
        if name not in _EXPORT_FOLDERS:
            raise ExportError(f"{path} lists {name!r}, not a folder an export makes: nothing was deleted")
    return manifest


def _in_the_way(out_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """Relative paths under ``out_dir`` that ``manifest`` does not account for (a folder that is not
    one of its folders is named once, not looked into).

    Raises:
        ExportError: a listed folder is a symbolic link (never followed).
    """
    files, folders = set(manifest.get("files", [])), set(manifest.get("folders", []))
    found = []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(out_dir / rel if rel else out_dir) as entries:
            for entry in entries:
                name = f"{rel}/{entry.name}" if rel else entry.name
                if name == MANIFEST:
                    continue
                if name in folders:
                    if not entry.is_dir(follow_symlinks=False):
                        raise ExportError(
                            f"{name} is a symbolic link, not the folder an export made: nothing was deleted"
                            if entry.is_symlink()
                            else f"{name} is not the folder an export made: nothing was deleted"
                        )
                    stack.append(name)
                elif name not in files or not entry.is_file(follow_symlinks=False):
                    found.append(name)
    return found


class _Manifest:
    """The manifest of the export being written: every file is listed before it is made."""

    def __init__(self, out_dir: Path, run: dict[str, Any], fmt: str, include: str, compressed: bool = False):
        self.path = out_dir / MANIFEST
        self.head = {
            "made_by": "hermes-batch export",
            "run": run,
            "format": fmt,
            "include": include,
            "compressed": compressed,
        }
        self.files: list[str] = []
        self.folders: list[str] = []

    def save(self, *, complete: bool = False) -> None:
        """Write the manifest (atomically)."""
        body = {**self.head, "complete": complete, "files": self.files, "folders": self.folders}
        write_json_atomic(self.path, body)

    def add(self, name: str) -> None:
        """List ``name`` (relative to the export folder) before it is made."""
        if name not in self.files:
            self.files.append(name)
            self.save()


def _prepare_out(
    out_dir: Path, overwrite: bool, run_dir: Path, output_dirs: Iterable[Path], manifest: _Manifest
) -> None:
    """Check ``out_dir``, delete an earlier export's listed files (``overwrite``), make the folder
    and its ``data/`` (listed in the new manifest first).

    Raises:
        ExportError: see :func:`export_run` (raised before anything is written or deleted).
    """
    problem = _place_problem(out_dir, run_dir, output_dirs)
    if problem:
        raise ExportError(f"--out {out_dir}: {problem}")
    try:
        try:
            present = sorted(os.listdir(out_dir))
        except (FileNotFoundError, NotADirectoryError):  # made below (or not: one error line there)
            present = []
        if present:
            _empty_earlier_export(out_dir, overwrite, present)
    except OSError as exc:
        raise ExportError(f"--out {out_dir}: cannot be read or emptied ({exc.strerror or exc})") from None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        manifest.save()
        manifest.folders.append("data")
        manifest.save()
        (out_dir / "data").mkdir(exist_ok=True)
    except OSError as exc:
        raise ExportError(f"--out {out_dir}: cannot be made ({exc.strerror or exc})") from None


def _empty_earlier_export(out_dir: Path, overwrite: bool, present: list[str]) -> None:
    """Delete the files (then the empty folders) of the earlier export in the non-empty ``out_dir``
    whose entries are ``present``, when ``overwrite`` and nothing else is in it.

    Raises:
        ExportError: not an export folder, no ``overwrite``, a bad manifest, or something in the way
            (nothing is deleted then).
        OSError: a listing or a deletion failed.
    """
    if not os.path.lexists(out_dir / MANIFEST):
        if overwrite:
            raise ExportError(
                f"--out {out_dir}: not a folder an export made (no {MANIFEST}): nothing was deleted; "
                f"it holds {_names(present)}"
            )
        raise ExportError(
            f"--out {out_dir}: folder is not empty and no export made it (no {MANIFEST}): "
            "choose a new or empty folder"
        )
    if not overwrite:
        raise ExportError(f"--out {out_dir}: folder is not empty (pass --overwrite to replace an export)")
    try:
        earlier = _read_manifest(out_dir)
        extra = _in_the_way(out_dir, earlier)
    except ExportError as exc:
        raise ExportError(f"--out {out_dir}: {exc}") from None
    if extra:
        raise ExportError(
            f"--out {out_dir}: holds files an earlier export did not write ({_names(extra)}): "
            "nothing was deleted; move them away or choose another folder"
        )
    for name in earlier.get("files", []):
        (out_dir / name).unlink(missing_ok=True)
    for name in earlier.get("folders", []):
        if not any((out_dir / name).iterdir()):
            (out_dir / name).rmdir()


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
    output_dirs: Iterable[Path] = (),
    compressed: bool = False,
) -> ExportResult:
    """Write ``out_dir/data/train-*.parquet``, ``out_dir/README.md`` and ``out_dir/``:data:`MANIFEST`
    from a finished run.

    Args:
        run_dir: the run folder (needs ``trajectories.jsonl``; run.json and statistics.json feed the card).
        out_dir: the dataset folder (created; must be empty unless ``overwrite``; never the run
            folder, an output folder, ``/``, a home folder, nor in or around them: see the module
            docstring).
        valid_tools: the registry's tool names (for ``include="all"``).
        fmt: ``sharegpt`` (rows as in trajectories.jsonl) or ``messages`` (:func:`messages_row`).
        include: ``kept`` (trajectories.jsonl), ``all`` (also the hallucinated-tool rows) or
            ``passed`` (the rows of trajectories.jsonl whose ``metadata.passed`` is true, after the
            re-scores of ``scores.jsonl``).
        license: the card's license id (None: ``other``).
        overwrite: replace an earlier export in ``out_dir``: deletes the files its manifest lists,
            and only when nothing else is in the folder.
        shard_bytes: JSON bytes per shard.
        output_dirs: more output folders (parents of run folders) ``out_dir`` may not be, hold or
            lie inside; the run folder's parent always is one.
        compressed: export the rows of ``trajectories_compressed.jsonl`` (``hermes-batch compress``)
            instead: with ``include="kept"`` all of them, ``"passed"`` those that passed;
            ``"all"`` is refused (the rows filtered for a hallucinated tool are never compressed).
            The card says to what budget, with which tokenizer, and the totals.

    Raises:
        ExportError: no trajectories.jsonl (with ``compressed``: no trajectories_compressed.jsonl,
            or ``include="all"``), no row, a malformed row or turn (naming the file and
            line), an unknown format/include, an ``out_dir`` refused as above (naming what is in
            the way; nothing is deleted), or a file that cannot be written (naming it).
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if include not in INCLUDES:
        raise ExportError(f"--include {include}: expected one of {', '.join(INCLUDES)}")
    if compressed and include == "all":
        raise ExportError(
            "--include all cannot be combined with --compressed: the rows filtered for a hallucinated tool "
            "are not compressed (hermes-batch compress reads trajectories.jsonl only); use --include kept or passed"
        )
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    merged = RunFolder(run_dir).trajectories
    if compressed and not RunFolder(run_dir).compressed.is_file():
        raise ExportError(
            f"{RunFolder(run_dir).compressed}: not found: run hermes-batch compress first "
            f"(hermes-batch compress {run_dir} --target_max_tokens N --tokenizer T)"
        )
    if not compressed and not merged.is_file():
        raise ExportError(
            f"{merged}: not found (the run has not been merged yet: let it finish or --resume it)"
        )
    try:
        summary = read_summary(run_dir)
        info = json.loads(RunFolder(run_dir).run_json.read_text(encoding="utf-8"))
    except FileNotFoundError:
        info = {}
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    run = {"run_name": summary.run_name, "run_id": info.get("run_id") if isinstance(info, dict) else None}
    manifest = _Manifest(out_dir, run, fmt, include, compressed)
    _prepare_out(out_dir, overwrite, run_dir, output_dirs, manifest)
    try:
        return _write(
            run_dir, out_dir, manifest, summary, valid_tools, fmt, include, license, shard_bytes, compressed
        )
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise ExportError(f"--out {out_dir}: {where}{exc.strerror or exc}") from None
    finally:
        (out_dir / _TMP).unlink(missing_ok=True)


def _write(
    run_dir: Path,
    out_dir: Path,
    manifest: _Manifest,
    summary: RunSummary,
    valid_tools: Collection[str],
    fmt: str,
    include: str,
    license: str | None,
    shard_bytes: int,
    compressed: bool = False,
) -> ExportResult:
    """The body of :func:`export_run` once ``out_dir`` is ready: rows, shards, card, final manifest."""
    folder = RunFolder(run_dir)
    merged = folder.compressed if compressed else folder.trajectories
    sources = [_kept_rows(merged)]
    if include == "all":
        sources.append(_filtered_rows(run_dir, valid_tools))
    rescores = read_rescores(run_dir) if RunFolder(run_dir).scores.exists() else {}
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

    manifest.add(_TMP)
    with open(tmp, "wb") as fh:
        for _, was_filtered, origin, row in heapq.merge(*sources, key=lambda item: item[0]):
            apply_rescore(row, rescores)
            if include == "passed" and (row.get("metadata") or {}).get("passed") is not True:
                continue
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
        why = "no row passed its scorers (--include passed)" if include == "passed" else "no rows to export"
        raise ExportError(f"{merged}: {why}")

    overrides = {}
    if fmt == "messages":
        schema = force_json(schema, ["tools", "[]", "function", "parameters"])
        schema = type_scores(schema, ())
    else:
        schema = type_scores(schema, ("metadata",))
        if timestamps_ok:
            overrides["metadata.timestamp"] = "timestamp[s]"
    storage = finalise(schema)
    parts = []
    for number, data in enumerate(line_chunks(tmp, shard_bytes)):
        part = out_dir / "data" / f".part-{number:05d}.parquet"
        manifest.add(f"data/{part.name}")
        with atomic_writer(part) as out:
            pl.read_ndjson(data, schema=storage).write_parquet(out)
        parts.append(part)
    tmp.unlink()
    shards = []
    for number, part in enumerate(parts):
        final = out_dir / "data" / f"train-{number:05d}-of-{len(parts):05d}.parquet"
        manifest.add(f"data/{final.name}")
        part.rename(final)
        shards.append(final)

    card = out_dir / "README.md"
    packed = compression_info.read_summary(folder.compression_metrics) if compressed else None
    text = render_card(
        summary,
        fmt=fmt,
        include=include,
        rows=rows,
        filtered_included=filtered,
        features=features_yaml(schema, overrides),
        data_glob="data/train-*.parquet",
        license=license,
        compression=compression_info.summary_text(packed or {}) if compressed else None,
    )
    manifest.add("README.md")
    with atomic_writer(card) as out:
        out.write(text.encode("utf-8"))
    manifest.files = ["README.md", *(f"data/{path.name}" for path in shards)]
    manifest.save(complete=True)
    return ExportResult(out_dir=out_dir, rows=rows, filtered_included=filtered, shards=shards, card=card)
