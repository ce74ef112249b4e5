"""An index of a run folder: one entry per prompt of the dataset, with where its outputs are on disk.

Built once by reading the batch files, ``discarded.jsonl`` and ``failures.jsonl`` line by line
(byte offsets kept, rows not kept) and the dataset named in ``run.json``; cached in the run
folder as ``.view-index.parquet`` (the table) and ``.view-index.json`` (what it was built from:
size and mtime of every input file). :meth:`RunIndex.refresh` rebuilds it when an input changed.
A page of the list is a polars filter over the in-memory table (a few MB for 100,000 prompts);
a row is read from its batch file by offset. The prompt texts stay in the parquet file and are
scanned only by a text search.

Status of a prompt (first that applies):

* ``kept`` - a row in a batch file (the first one per prompt_id, as the merge keeps it) whose
  ``tool_stats`` names only registry tools: it is in ``trajectories.jsonl``;
* ``filtered`` - a row that calls a tool outside the registry (hallucinated), left out of the merge;
* ``discarded`` - a tombstone in ``discarded.jsonl``: no reasoning in any assistant turn;
* ``rejected`` - a kept row that the merge's ``--keep passed|best`` filter moved to ``rejected.jsonl``;
* ``failed`` - a line in ``failures.jsonl`` and nothing else;
* ``pending`` - nothing yet: not run.

When the run was compressed to a token budget (``hermes-batch compress``), a kept row also has
the offset of its compressed row in ``trajectories_compressed.jsonl`` (matched by prompt_id) and
its figures from ``compression_metrics.json`` (:mod:`flows.viewer.compression`);
:attr:`RunIndex.compression` holds the run's totals and settings.

Each prompt also has a score outcome (``passed``, ``failed``, ``errored`` or none) and the mean of
its score values, with the re-scores of ``scores.jsonl`` laid over its row (:mod:`flows.viewer.scores`);
:meth:`RunIndex.row` returns the row with them laid over too.

Pure Python + polars, no Prefect.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from flows.viewer import compression, scores
from hermes_core.dataset import DatasetError, read_dataset
from hermes_core.runfolder.files import (  # the merge's own file reading
    atomic_writer,
    iter_raw_lines,
    loads_object,
    write_json_atomic,
)
from hermes_core.runfolder.folder import (
    DISCARDED_FILE,
    FAILURES_FILE,
    VIEW_INDEX_FILE,
    VIEW_INDEX_META_FILE,
    RunFolder,
)
from hermes_core.runfolder.postprocess import batch_files
from hermes_core.runfolder.rescores import Rescores, apply_rescore
from hermes_core.runfolder.run_info import prompt_identity, read_run_info, resolve_dataset

__all__ = [
    "STATUSES",
    "STATUS_LABELS",
    "Filters",
    "RunIndexError",
    "RunIndex",
]

INDEX_VERSION = 3
HEAD_CHARS = 120
REFRESH_SECONDS = 1.0

STATUSES = ("kept", "rejected", "discarded", "filtered", "failed", "pending")
"""Every status, in the order the run page lists them."""

STATUS_LABELS = {
    "kept": "kept",
    "rejected": "rejected (--keep filter)",
    "discarded": "discarded (no reasoning)",
    "filtered": "filtered (hallucinated tool)",
    "failed": "failed",
    "pending": "not run yet",
}
"""Human wording of each status."""

_SCHEMA = {
    "prompt_index": pl.Int64,
    "prompt_id": pl.String,
    "prompt": pl.String,
    "head": pl.String,
    "status": pl.String,
    "sample_index": pl.Int64,
    "score": pl.String,
    "score_mean": pl.Float64,
    "completed": pl.Boolean,
    "partial": pl.Boolean,
    "tools": pl.List(pl.String),
    "tool_errors": pl.Int64,
    "file": pl.String,
    "offset": pl.Int64,
    "length": pl.Int64,
    "tomb_offset": pl.Int64,
    "tomb_length": pl.Int64,
    "fail_offsets": pl.List(pl.Int64),
    "fail_lengths": pl.List(pl.Int64),
    "rescore_offsets": pl.List(pl.Int64),
    "rescore_lengths": pl.List(pl.Int64),
    "comp_offset": pl.Int64,
    "comp_length": pl.Int64,
    "comp_status": pl.String,
    "comp_tokens_before": pl.Int64,
    "comp_tokens_after": pl.Int64,
    "comp_turns_before": pl.Int64,
    "comp_turns_after": pl.Int64,
    "comp_region_first": pl.Int64,
    "comp_region_last": pl.Int64,
    "comp_error": pl.String,
}
_SPACE = re.compile(r"\s+")


class _Row(NamedTuple):
    """What the index keeps of a batch-file row."""

    prompt_index: int
    prompt: str
    sample_index: int | None
    score: str | None  # passed | failed | None (not scored), after the re-scores
    score_mean: float | None
    completed: bool
    partial: bool
    tools: tuple[str, ...]
    tool_errors: int
    file: str
    offset: int
    length: int


class RunIndexError(ValueError):
    """The folder is not a run folder this index can read (the message names the path)."""


@dataclass(frozen=True)
class Filters:
    """What the prompt list shows; every field left at its default shows everything.

    Attributes:
        status: one of :data:`STATUSES`, or ``""`` for all.
        score: one of :data:`flows.viewer.scores.OUTCOMES`, or ``""`` for all.
        partial: only rows with ``partial=true``.
        turn_limit: only rows the turn limit ended (``completed=false``).
        tool: only rows that called this tool (``""`` = any).
        tool_errors: only rows with at least one failed tool call.
        q: case-insensitive substring of the prompt text (``""`` = any).
    """

    status: str = ""
    score: str = ""
    partial: bool = False
    turn_limit: bool = False
    tool: str = ""
    tool_errors: bool = False
    q: str = ""


def _head(text: str) -> str:
    """The start of a prompt on one line: whitespace runs collapsed, at most HEAD_CHARS characters."""
    flat = _SPACE.sub(" ", text).strip()
    return flat if len(flat) <= HEAD_CHARS else flat[: HEAD_CHARS - 1] + "…"


def _human_text(row: dict[str, Any]) -> str:
    for turn in row.get("conversations") or ():
        if isinstance(turn, dict) and turn.get("from") == "human":
            return str(turn.get("value") or "")
    return ""


class RunIndex:
    """The prompt table of one run folder. Build with :meth:`open`; thread-safe.

    Attributes:
        run_dir: the run folder.
        table: one row per prompt (columns of ``_SCHEMA`` without ``prompt``), by prompt_index.
        notes: sentences about what could not be read (dataset missing or changed, orphan rows).
        build_seconds: time of the last build (0.0 when the cache was used).
        compression: ``{"totals", "settings"}`` of ``compression_metrics.json``, or None when the
            run was not compressed (:mod:`flows.viewer.compression`).
    """

    def __init__(self, run_dir: Path, dataset: Path | None, valid_tools: Collection[str]):
        self.run_dir = Path(run_dir)
        self._dataset_arg = dataset
        self._tools = frozenset(valid_tools)
        self._lock = threading.Lock()
        self._checked = 0.0
        self._signature: dict[str, list[int]] = {}
        self.table = pl.DataFrame(schema={k: v for k, v in _SCHEMA.items() if k != "prompt"})
        self.notes: list[str] = []
        self.build_seconds = 0.0
        self.info: dict[str, Any] = {}
        self.compression: dict[str, Any] | None = None
        self._cache_dir = self.run_dir

    @classmethod
    def open(cls, run_dir: Path, *, valid_tools: Collection[str], dataset: Path | None = None) -> RunIndex:
        """Load the cached index of ``run_dir`` or build it.

        Args:
            run_dir: a run folder (``data/<run_name>``) with a ``run.json``.
            valid_tools: the registry's tool names (a row naming another tool is ``filtered``).
            dataset: the dataset file; None takes the path recorded in run.json.

        Raises:
            RunIndexError: ``run_dir`` is not a folder or has no ``run.json``.
        """
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise RunIndexError(f"{run_dir}: not a folder")
        if not RunFolder(run_dir).run_json.is_file():
            raise RunIndexError(f"{run_dir}: no run.json (not a hermes-batch run folder)")
        index = cls(run_dir, dataset, valid_tools)
        index.refresh(force=True)
        return index

    # --- building -----------------------------------------------------------------------------

    def _dataset_path(self) -> Path | None:
        if self._dataset_arg is not None:
            return Path(self._dataset_arg)
        return resolve_dataset(self.run_dir, (self.info.get("dataset") or {}).get("path"))

    def _inputs(self) -> list[Path]:
        files = [*batch_files(self.run_dir)]
        folder = RunFolder(self.run_dir)
        files += [folder.discarded, folder.failures, folder.rejected, folder.scores, folder.run_json]
        files += [folder.compressed, folder.compression_metrics]
        dataset = self._dataset_path()
        if dataset is not None:
            files.append(dataset)
        return files

    def _current_signature(self) -> dict[str, list[int]]:
        signature = {"version": [INDEX_VERSION]}
        for path in self._inputs():
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            signature[str(path)] = [st.st_size, st.st_mtime_ns]
        return signature

    def refresh(self, *, force: bool = False) -> bool:
        """Rebuild the index when an input file changed (checked at most once a second).

        Returns:
            True when the table was reloaded or rebuilt.
        """
        with self._lock:
            now = time.monotonic()
            if not force and now - self._checked < REFRESH_SECONDS:
                return False
            self._checked = now
            info = read_run_info(self.run_dir)
            self.info = info.data if info else {}
            signature = self._current_signature()
            if not force and signature == self._signature:
                return False
            if not self._load_cache(signature):
                self._build(signature)
            self._signature = signature
            return True

    def _cache_paths(self) -> tuple[Path, Path]:
        return self._cache_dir / VIEW_INDEX_FILE, self._cache_dir / VIEW_INDEX_META_FILE

    def _load_cache(self, signature: dict[str, list[int]]) -> bool:
        for folder in (self.run_dir, self._fallback_dir()):
            table_path, meta_path = folder / VIEW_INDEX_FILE, folder / VIEW_INDEX_META_FILE
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if meta.get("signature") != signature or not table_path.is_file():
                continue
            self._cache_dir = folder
            columns = [c for c in _SCHEMA if c != "prompt"]
            self.table = pl.read_parquet(table_path, columns=columns)
            self.notes = list(meta.get("notes", []))
            self.compression = meta.get("compression")
            self.build_seconds = 0.0
            return True
        return False

    def _fallback_dir(self) -> Path:
        digest = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"hermes-view-{digest}"

    def _build(self, signature: dict[str, list[int]]) -> None:
        """Read every input and make the table, column by column (memory: a few small objects per prompt)."""
        started = time.monotonic()
        notes: list[str] = []
        prompts = self._dataset_prompts(notes)
        rescored = scores.scan(RunFolder(self.run_dir).scores)
        rows, hallucinated = self._scan_rows(keep_text=prompts is None, newest=rescored.newest)
        rejected = self._scan_rejected()
        tombs = self._scan_tombstones()
        failures = self._scan_failures()
        packed, figures = self._scan_compression(notes)
        no_figures = (None,) * len(compression.ROW_FIGURES)
        if prompts is None:  # no dataset: list what the run folder knows
            prompts = {
                pid: (found.prompt_index, found.prompt, found.sample_index or 0)
                for pid, found in rows.items()
            }
            for pid, (index, _, _) in tombs.items():
                prompts.setdefault(pid, (index, "", 0))
            for pid, entries in failures.items():
                prompts.setdefault(pid, (entries[-1][0], "", 0))
        else:
            orphans = sum(1 for pid in rows if pid not in prompts)
            if orphans:
                notes.append(f"{orphans} rows belong to prompts that are not in the dataset (not listed)")
        columns: dict[str, list[Any]] = {name: [] for name in _SCHEMA}
        for pid, (index, text, sample) in prompts.items():
            found = rows.get(pid)
            tomb = tombs.get(pid)
            fails = failures.get(pid, ())
            outcome = mean = None
            if found is not None:
                status = "filtered" if pid in hallucinated else "rejected" if pid in rejected else "kept"
                text = text or found.prompt
                outcome, mean = found.score, found.score_mean
            else:
                status = "discarded" if tomb is not None else "failed" if fails else "pending"
                if status == "failed" and fails[-1][3] == "infra":
                    outcome = "errored"
            lines = rescored.lines.get(pid, ()) if found is not None else ()
            where = packed.get(pid) if found is not None else None
            figure = figures.get(pid, no_figures) if found is not None else no_figures
            values = {
                "prompt_index": index,
                "prompt_id": pid,
                "prompt": text,
                "head": _head(text),
                "status": status,
                "sample_index": sample,
                "score": outcome,
                "score_mean": mean,
                "completed": found.completed if found else None,
                "partial": found.partial if found else None,
                "tools": list(found.tools) if found else [],
                "tool_errors": found.tool_errors if found else None,
                "file": found.file if found else None,
                "offset": found.offset if found else None,
                "length": found.length if found else None,
                "tomb_offset": tomb[1] if tomb else None,
                "tomb_length": tomb[2] if tomb else None,
                "fail_offsets": [f[1] for f in fails],
                "fail_lengths": [f[2] for f in fails],
                "rescore_offsets": [offset for offset, _ in lines],
                "rescore_lengths": [length for _, length in lines],
                "comp_offset": where[0] if where else None,
                "comp_length": where[1] if where else None,
                **{
                    f"comp_{name}": value for name, value in zip(compression.ROW_FIGURES, figure, strict=True)
                },
            }
            for name, value in values.items():
                columns[name].append(value)
        del prompts, rows, tombs, failures, packed, figures
        full = pl.DataFrame(columns, schema=_SCHEMA).sort("prompt_index", "sample_index")
        del columns
        self.build_seconds = round(time.monotonic() - started, 3)
        self.notes = notes
        self._write_cache(full, signature)
        self.table = full.drop("prompt")

    def _write_cache(self, full: pl.DataFrame, signature: dict[str, list[int]]) -> None:
        """Write the table and its signature into the run folder, or a temp folder when it is read-only."""
        meta = {
            "signature": signature,
            "notes": self.notes,
            "build_seconds": self.build_seconds,
            "compression": self.compression,
        }
        for folder in (self.run_dir, self._fallback_dir()):
            try:
                folder.mkdir(parents=True, exist_ok=True)
                with atomic_writer(folder / VIEW_INDEX_FILE) as fh:
                    full.write_parquet(fh)
                write_json_atomic(folder / VIEW_INDEX_META_FILE, meta)
            except OSError:
                continue
            self._cache_dir = folder
            return
        raise OSError(f"cannot write the index of {self.run_dir} (run folder and {tempfile.gettempdir()})")

    def _scan_rows(
        self, *, keep_text: bool, newest: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, _Row], set[str]]:
        """First row per prompt_id in batch order, as a :class:`_Row` (its human turn only with
        ``keep_text``; its score with the re-scores ``newest`` laid over), and the ids of rows that
        name a tool outside the registry."""
        rows: dict[str, _Row] = {}
        hallucinated: set[str] = set()
        for path in batch_files(self.run_dir):
            for offset, raw, _, _ in iter_raw_lines(path):
                row = loads_object(raw)
                if row is None:
                    continue  # a torn last line; the ledger repairs it on the next run
                metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
                pid = metadata.get("prompt_id")
                if not isinstance(pid, str) or pid in rows:
                    continue
                stats = row.get("tool_stats") if isinstance(row.get("tool_stats"), dict) else {}
                errors = (
                    row.get("tool_error_counts") if isinstance(row.get("tool_error_counts"), dict) else {}
                )
                if not self._tools.issuperset(stats):
                    hallucinated.add(pid)
                index = row.get("prompt_index")
                sample = metadata.get("sample_index")
                outcome, mean = scores.outcome(metadata, newest.get(pid))
                rows[pid] = _Row(
                    prompt_index=index if isinstance(index, int) else -1,
                    prompt=_human_text(row) if keep_text else "",
                    sample_index=sample if type(sample) is int else None,
                    score=outcome,
                    score_mean=mean,
                    completed=bool(row.get("completed")),
                    partial=bool(row.get("partial")),
                    tools=tuple(
                        sorted(t for t, v in stats.items() if isinstance(v, dict) and v.get("count"))
                    ),
                    tool_errors=sum(v for v in errors.values() if isinstance(v, int)),
                    file=path.name,
                    offset=offset,
                    length=len(raw),
                )
        return rows, hallucinated

    def _scan_compression(
        self, notes: list[str]
    ) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[Any, ...]]]:
        """(prompt_id -> offset and length in ``trajectories_compressed.jsonl``, prompt_id -> figures of
        ``compression_metrics.json``); sets :attr:`compression` (None when the run has no compressed file)."""
        folder = RunFolder(self.run_dir)
        self.compression = None
        if not folder.compressed.is_file():
            return {}, {}
        packed = compression.scan_compressed(folder.compressed)
        summary, figures = compression.scan_metrics(folder.compression_metrics)
        self.compression = summary
        if summary is None:
            notes.append(f"{folder.compression_metrics.name} missing or unreadable: no compression figures")
        merged = folder.trajectories
        try:
            if merged.stat().st_mtime_ns > folder.compressed.stat().st_mtime_ns:
                notes.append(
                    f"{merged.name} was rewritten after {folder.compressed.name}: the compressed rows may be "
                    "out of date (run hermes-batch compress again)"
                )
        except FileNotFoundError:
            pass
        return packed, figures

    def _scan_jsonl(self, name: str) -> Iterator[tuple[dict[str, Any], int, int]]:
        path = self.run_dir / name
        if not path.is_file():
            return
        for offset, raw, _, _ in iter_raw_lines(path):
            obj = loads_object(raw)
            if obj is not None and isinstance(obj.get("prompt_id"), str):
                yield obj, offset, len(raw)

    def _scan_rejected(self) -> set[str]:
        """The prompt_ids of the rows in ``rejected.jsonl`` (the merge's ``--keep`` filter)."""
        path = RunFolder(self.run_dir).rejected
        found: set[str] = set()
        if path.is_file():
            for _, raw, _, _ in iter_raw_lines(path):
                row = loads_object(raw)
                metadata = row.get("metadata") if row is not None else None
                if isinstance(metadata, dict) and isinstance(metadata.get("prompt_id"), str):
                    found.add(metadata["prompt_id"])
        return found

    def _scan_tombstones(self) -> dict[str, tuple[int, int, int]]:
        """prompt_id -> (prompt_index, offset, length) of its first tombstone."""
        found: dict[str, tuple[int, int, int]] = {}
        for tomb, offset, length in self._scan_jsonl(DISCARDED_FILE):
            index = tomb.get("prompt_index")
            found.setdefault(tomb["prompt_id"], (index if isinstance(index, int) else -1, offset, length))
        return found

    def _scan_failures(self) -> dict[str, list[tuple[int, int, int, str | None]]]:
        """prompt_id -> [(prompt_index, offset, length, kind)] of every failure line, oldest first."""
        found: dict[str, list[tuple[int, int, int, str | None]]] = {}
        for line, offset, length in self._scan_jsonl(FAILURES_FILE):
            index = line.get("prompt_index")
            kind = line.get("kind") if isinstance(line.get("kind"), str) else None
            found.setdefault(line["prompt_id"], []).append(
                (index if isinstance(index, int) else -1, offset, length, kind)
            )
        return found

    def _dataset_prompts(self, notes: list[str]) -> dict[str, tuple[int, str, int]] | None:
        """prompt_id -> (prompt_index, prompt, sample_index) of every sample of the dataset's records,
        or None when it cannot be read."""
        recorded = self.info.get("dataset") or {}
        path = self._dataset_path()
        if path is None:
            notes.append(
                f"dataset {recorded.get('path')!r} not found: prompts not run yet are not listed "
                "(pass --dataset to name it)"
            )
            return None
        try:
            dataset = read_dataset(path, max_samples=recorded.get("records") or None, skip_invalid=True)
        except DatasetError as exc:
            notes.append(
                f"dataset not readable ({str(exc).splitlines()[0]}): prompts not run yet are not listed"
            )
            return None
        if recorded.get("fingerprint") and dataset.fingerprint != recorded["fingerprint"]:
            notes.append(f"dataset {path} changed since the run: prompts are matched by identity")
        settings_hash = self.info.get("settings_hash", "")
        samples = self.info.get("samples_per_prompt") or 1
        return {
            prompt_identity(r.content_key, settings_hash, sample): (r.prompt_index, r.prompt, sample)
            for r in dataset.records
            for sample in range(samples)
        }

    # --- reading ------------------------------------------------------------------------------

    def select(self, filters: Filters) -> pl.DataFrame:
        """The table rows that pass ``filters``, by prompt_index."""
        self.refresh()
        table = self.table
        conditions = []
        if filters.status:
            conditions.append(pl.col("status") == filters.status)
        if filters.score:
            conditions.append(pl.col("score") == filters.score)
        if filters.partial:
            conditions.append(pl.col("partial").fill_null(False))
        if filters.turn_limit:
            conditions.append(pl.col("completed").not_().fill_null(False))
        if filters.tool:
            conditions.append(pl.col("tools").list.contains(filters.tool))
        if filters.tool_errors:
            conditions.append(pl.col("tool_errors").fill_null(0) > 0)
        if conditions:
            table = table.filter(*conditions)
        if filters.q:
            matches = (
                pl.scan_parquet(self._cache_paths()[0])
                .select("prompt_index", "prompt")
                .filter(pl.col("prompt").str.to_lowercase().str.contains(filters.q.lower(), literal=True))
                .select("prompt_index")
                .collect()
            )
            table = table.join(matches, on="prompt_index", how="semi").sort("prompt_index", "sample_index")
        return table

    def page(self, filters: Filters, page: int, per_page: int) -> tuple[list[dict[str, Any]], int]:
        """Entries of one page (1-based) of the filtered list, and the number of matching prompts."""
        selected = self.select(filters)
        start = max(0, (page - 1) * per_page)
        return selected.slice(start, per_page).to_dicts(), selected.height

    def entry(self, prompt_index: int, sample_index: int = 0) -> dict[str, Any] | None:
        """The table row of one prompt (a sample of a record), or None."""
        self.refresh()
        found = self.table.filter(
            pl.col("prompt_index") == prompt_index, pl.col("sample_index") == sample_index
        )
        return found.row(0, named=True) if found.height else None

    def neighbours(
        self, prompt_index: int, sample_index: int, filters: Filters
    ) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """``(prompt_index, sample_index)`` of the previous and next prompt of the filtered list
        around that prompt (None at either end)."""
        keys = self.select(filters).select("prompt_index", "sample_index")
        index, sample = pl.col("prompt_index"), pl.col("sample_index")
        before = keys.filter((index < prompt_index) | ((index == prompt_index) & (sample < sample_index)))
        after = keys.filter((index > prompt_index) | ((index == prompt_index) & (sample > sample_index)))
        return (before.row(-1) if before.height else None, after.row(0) if after.height else None)

    def prompt_text(self, prompt_index: int) -> str:
        """The full prompt text of one prompt (``""`` when not known)."""
        found = (
            pl.scan_parquet(self._cache_paths()[0])
            .filter(pl.col("prompt_index") == prompt_index)
            .select("prompt")
            .collect()
        )
        return found["prompt"][0] if found.height else ""

    def _read(self, name: str, offset: int, length: int) -> dict[str, Any]:
        with open(self.run_dir / name, "rb") as fh:
            fh.seek(offset)
            raw = fh.read(length)
        obj = loads_object(raw)
        if obj is None:
            raise RunIndexError(f"{self.run_dir / name}: no JSON object at byte {offset} (file changed?)")
        return obj

    def row(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """The trajectory row of an entry (read by offset from its batch file) with its re-scores
        laid over (:meth:`rescores`), or None."""
        if entry.get("file") is None:
            return None
        row = self._read(entry["file"], entry["offset"], entry["length"])
        apply_rescore(row, self.rescores(entry))
        return row

    def rescores(self, entry: dict[str, Any]) -> Rescores:
        """The re-scores ``scores.jsonl`` gives an entry's row (``{}`` when none)."""
        if not entry.get("rescore_offsets"):
            return {}
        path = RunFolder(self.run_dir).scores
        return scores.rescores_of(scores.read_lines(path, entry["rescore_offsets"], entry["rescore_lengths"]))

    def compressed_row(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """The entry's row in ``trajectories_compressed.jsonl`` (read by offset), or None."""
        if entry.get("comp_offset") is None:
            return None
        return self._read(RunFolder(self.run_dir).compressed.name, entry["comp_offset"], entry["comp_length"])

    def compression_figures(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """The entry's figures of ``compression_metrics.json`` (:data:`flows.viewer.compression.ROW_FIGURES`),
        or None when it has none."""
        if entry.get("comp_status") is None:
            return None
        return {name: entry[f"comp_{name}"] for name in compression.ROW_FIGURES}

    def tombstone(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """The discard tombstone of an entry, or None."""
        if entry.get("tomb_offset") is None:
            return None
        return self._read(DISCARDED_FILE, entry["tomb_offset"], entry["tomb_length"])

    def failures(self, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """Every failure line of an entry, oldest first."""
        return [
            self._read(FAILURES_FILE, offset, length)
            for offset, length in zip(
                entry.get("fail_offsets") or [], entry.get("fail_lengths") or [], strict=True
            )
        ]

    def counts(self) -> dict[str, int]:
        """Prompts per status (every status of :data:`STATUSES`, 0 when none)."""
        self.refresh()
        found = dict(self.table.group_by("status").len().iter_rows())
        return {status: int(found.get(status, 0)) for status in STATUSES}

    def score_counts(self) -> dict[str, int]:
        """Prompts per score outcome (every one of :data:`flows.viewer.scores.OUTCOMES`, 0 when none)."""
        self.refresh()
        found = dict(self.table.group_by("score").len().iter_rows())
        return {outcome: int(found.get(outcome, 0)) for outcome in scores.OUTCOMES}

    def tools_used(self) -> list[str]:
        """Sorted names of the tools called by at least one row."""
        self.refresh()
        return sorted(self.table["tools"].explode().drop_nulls().unique().to_list())
