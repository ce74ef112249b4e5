"""Merge a run folder's batch files into ``trajectories.jsonl`` and compute ``statistics.json`` (README § Outputs).

Pure Python + polars, no Prefect: the flow wraps these functions in tasks. Both functions stream:
the merge keeps only a small index entry per row (batch file, byte offset, length, target index)
and copies rows by offset in a second pass; the statistics decode only the needed fields with
polars' NDJSON reader in streaming mode.

Both remember what they computed in ``.merge-state.<merged file>.json`` (additive, next to the
outputs): the merge's inputs (every batch file's name, size and modification time, a digest of
``index_of``, the valid tools), the merged file's size and time, the merge counts and the
statistics' row sums. A merge whose inputs and output are unchanged is not done again, and the
statistics of an unchanged merged file are not read again: a ``--resume`` of a finished run of
10^6 prompts would otherwise re-read tens of GB (bench/resume.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, NamedTuple

import polars as pl

from hermes_core.runfolder.files import (
    atomic_writer,
    iter_raw_lines,
    line_chunks,
    loads_object,
    write_json_atomic,
)
from hermes_core.runfolder.folder import TRAJECTORIES_FILE, RunFolder, merge_state_name
from hermes_core.runfolder.rescores import apply_rescore, read_rescores
from hermes_core.scoring import KEEP_CHOICES, SCORERS

__all__ = ["MergeResult", "batch_files", "compute_statistics", "merge_trajectories", "write_json_atomic"]

log = logging.getLogger(__name__)

_MAX_OPEN_FILES = 32
# Bytes of lines decoded per polars call in compute_statistics. Measured on 100,000 rows (1.4 GB,
# bench/postprocess.py): 16 MB chunks peaked at 269 MB RSS in 7.7 s, 4 MB at 177 MB in 5.1 s.
_CHUNK_BYTES = 4 << 20


@dataclass
class MergeResult:
    """What :func:`merge_trajectories` wrote and left out.

    Attributes:
        rows_written: rows in the merged file.
        duplicates_dropped: later copies of a prompt_id already seen (a resumed run's re-written rows).
        filtered_hallucinated: rows whose ``tool_stats`` name a tool outside ``valid_tools``.
        orphaned: rows that cannot be placed: prompt_id not in ``index_of`` (or missing), or,
            without ``index_of``, no integer ``prompt_index``.
        torn_lines: lines that are not a JSON object (a killed writer's torn last line; a bad
            line elsewhere is counted too and logged as a warning).
        path: the merged file.
        keep: the filter applied (``all``, ``passed``, ``best``: :data:`KEEP_CHOICES`).
        rejected: rows the filter left out (written to ``rejected.jsonl``).
    """

    rows_written: int
    duplicates_dropped: int
    filtered_hallucinated: int
    orphaned: int
    torn_lines: int
    path: Path
    keep: str = "all"
    rejected: int = 0


class _Entry(NamedTuple):
    """Where a kept row is, and where it goes."""

    index: int  # prompt_index in the output
    sample: int  # metadata.sample_index (0 when absent): the samples of a record in their order
    file_no: int  # position of the batch file in batch-number order
    offset: int  # byte offset of the line in the batch file
    length: int  # bytes of the line without its line end
    rewrite: bool  # prompt_index must be rewritten, or scores.jsonl gives it newer scores
    passed: bool  # metadata.passed is true
    score: float  # mean of the row's metadata.score values (0.0 when not scored)
    api_calls: int  # the row's api_calls (fewer wins a tie of --keep best)


def _kept(entries: list[_Entry], keep: str) -> list[bool]:
    """For sorted ``entries``, whether each is kept by the ``keep`` filter (:data:`KEEP_CHOICES`)."""
    if keep == "all":
        return [True] * len(entries)
    if keep == "passed":
        return [entry.passed for entry in entries]

    def rank(entry: _Entry) -> tuple[float, int]:
        return entry.score, -entry.api_calls

    best: dict[int, int] = {}  # prompt_index -> position of its best entry so far (the first of equals)
    for position, entry in enumerate(entries):
        chosen = best.get(entry.index)
        if chosen is None or rank(entry) > rank(entries[chosen]):
            best[entry.index] = position
    winners = set(best.values())
    return [position in winners for position in range(len(entries))]


def _score_of(metadata: Any) -> tuple[bool, float]:
    """(metadata.passed is true, mean of metadata.score's values) of a row's metadata."""
    if not isinstance(metadata, dict):
        return False, 0.0
    scores = metadata.get("score")
    values = [
        s["value"]
        for s in (scores.values() if isinstance(scores, dict) else ())
        if isinstance(s, dict) and isinstance(s.get("value"), int | float)
    ]
    return metadata.get("passed") is True, sum(values) / len(values) if values else 0.0


def batch_files(run_dir: Path) -> list[Path]:
    """``batch_<n>.jsonl`` files of ``run_dir``, sorted by n (numerically)."""
    return RunFolder(run_dir).batch_files()


def merge_trajectories(
    run_dir: Path,
    *,
    index_of: Mapping[str, int] | None,
    valid_tools: Collection[str],
    out_name: str = TRAJECTORIES_FILE,
    keep: str = "all",
) -> MergeResult:
    """Merge ``run_dir/batch_*.jsonl`` into ``run_dir/<out_name>``, ordered by prompt_index.

    The first occurrence of a prompt_id (``metadata.prompt_id``) wins, in batch-number then line
    order; rows without a prompt_id are deduplicated by their prompt_index. Rows are copied
    byte-for-byte (line end normalised to ``\\n``) unless their prompt_index changes or
    ``scores.jsonl`` gives them newer scores (:mod:`hermes_core.runfolder.rescores`, laid over
    before the ``keep`` filter), in which case they are re-serialised with
    ``json.dumps(row, ensure_ascii=False)`` (key order kept). The output
    is written to a temp file, fsynced and renamed (atomic). Memory: one row at a time plus ~100
    bytes per kept row.

    Args:
        run_dir: the run folder.
        index_of: prompt_id -> current prompt_index; rows of other prompt_ids are left out
            (``orphaned``). None keeps each row's own prompt_index.
        valid_tools: the registry's tool names; a row whose ``tool_stats`` has another key is dropped.
        out_name: name of the merged file inside ``run_dir``.
        keep: the filter by score, one of :data:`KEEP_CHOICES`; the rows it leaves out go, in the
            same order and form, to ``rejected.jsonl`` (removed when ``keep`` is ``all``). The
            no-reasoning and hallucinated-tool filters apply first.

    Returns:
        The :class:`MergeResult` counts.

    Raises:
        OSError: a batch file cannot be read or the output cannot be written.
    """
    run_dir = Path(run_dir)
    tools = frozenset(valid_tools)
    files = batch_files(run_dir)
    out_path = run_dir / out_name
    if keep not in KEEP_CHOICES:
        raise ValueError(f"keep must be one of {', '.join(KEEP_CHOICES)} (got {keep!r})")
    scores_path = RunFolder(run_dir).scores
    inputs = {**_merge_inputs(files, index_of, tools), "keep": keep, "scores": _signature(scores_path)}
    rescores = read_rescores(run_dir) if scores_path.exists() else {}
    rejected_path = RunFolder(run_dir).rejected
    state = _read_state(out_path)
    outputs = [_signature(out_path), _signature(rejected_path)]
    if state.get("inputs") == inputs and state.get("outputs") == outputs:
        return MergeResult(**state["merge"], path=out_path)  # same inputs, same outputs: nothing to do
    entries: list[_Entry] = []
    seen: set[Any] = set()
    duplicates = hallucinated = orphaned = torn = 0

    for file_no, path in enumerate(files):
        for offset, raw, line_no, is_last in iter_raw_lines(path):
            row = loads_object(raw)
            if row is None:
                torn += 1
                if not is_last:
                    log.warning("%s line %d is not a JSON object; skipped", path, line_no)
                continue
            metadata = row.get("metadata")
            prompt_id = metadata.get("prompt_id") if isinstance(metadata, dict) else None
            own_index = row.get("prompt_index")
            if not isinstance(prompt_id, str):
                prompt_id = None
            if index_of is not None:
                if prompt_id is None or prompt_id not in index_of:
                    orphaned += 1
                    continue
                index = index_of[prompt_id]
            elif isinstance(own_index, int) and not isinstance(own_index, bool):
                index = own_index
            else:
                orphaned += 1
                continue
            key = prompt_id if prompt_id is not None else ("index", index)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            tool_stats = row.get("tool_stats")
            if isinstance(tool_stats, dict) and not tools.issuperset(tool_stats):
                hallucinated += 1
                continue
            rewrite = type(own_index) is not int or own_index != index
            rewrite = apply_rescore(row, rescores) or rewrite
            passed, score = _score_of(metadata)
            api_calls = row.get("api_calls") if type(row.get("api_calls")) is int else 0
            sample = metadata.get("sample_index") if isinstance(metadata, dict) else None
            sample = sample if type(sample) is int else 0
            entry = _Entry(index, sample, file_no, offset, len(raw), rewrite, passed, score, api_calls)
            entries.append(entry)

    entries.sort(key=lambda e: (e.index, e.sample, e.file_no, e.offset))
    kept = _kept(entries, keep)
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(_FilePool(files))
        out = stack.enter_context(atomic_writer(out_path))
        rejected = stack.enter_context(atomic_writer(rejected_path)) if keep != "all" else None
        for entry, keep_it in zip(entries, kept, strict=True):
            raw = pool.read(entry.file_no, entry.offset, entry.length)
            if entry.rewrite:
                row = json.loads(raw)
                apply_rescore(row, rescores)
                row = {"prompt_index": entry.index, **row} if "prompt_index" not in row else row
                row["prompt_index"] = entry.index
                raw = json.dumps(row, ensure_ascii=False).encode("utf-8")
            target = out if keep_it else rejected
            target.write(raw)
            target.write(b"\n")
    if keep == "all":
        rejected_path.unlink(missing_ok=True)  # an earlier merge's, with another filter
    counts = {
        "rows_written": sum(kept),
        "duplicates_dropped": duplicates,
        "filtered_hallucinated": hallucinated,
        "orphaned": orphaned,
        "torn_lines": torn,
        "keep": keep,
        "rejected": len(kept) - sum(kept),
    }
    outputs = [_signature(out_path), _signature(rejected_path)]
    _write_state(out_path, {"inputs": inputs, "outputs": outputs, "merge": counts})
    return MergeResult(**counts, path=out_path)


def _signature(path: Path) -> list[int] | None:
    """[size, modification time in ns] of a file, or None when it does not exist."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _merge_inputs(files: list[Path], index_of: Mapping[str, int] | None, tools: frozenset[str]) -> dict:
    """What decides a merge's output: the batch files' signatures, a digest of ``index_of``, the tools."""
    digest = None
    if index_of is not None:
        h = hashlib.sha256()
        for key, value in index_of.items():
            h.update(f"{key}\t{value}\n".encode())
        digest = h.hexdigest()
    return {
        "files": [[path.name, *(_signature(path) or [])] for path in files],
        "index_of": digest,
        "tools": sorted(tools),
    }


def _state_path(out_path: Path) -> Path:
    return out_path.with_name(merge_state_name(out_path.name))


def _read_state(out_path: Path) -> dict[str, Any]:
    """The remembered merge and statistics of ``out_path`` (empty when missing or unreadable)."""
    try:
        state = json.loads(_state_path(out_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(out_path: Path, state: dict[str, Any]) -> None:
    write_json_atomic(_state_path(out_path), state)


def compute_statistics(
    run_dir: Path,
    *,
    merge: MergeResult,
    run_name: str,
    distribution: str,
    model: str,
    batch_size: int,
    index_of: Mapping[str, int],
    duration_seconds: float,
    failed_prompt_ids: Collection[str],
    valid_tools: Collection[str],
    flow_run_id: str | None = None,
    samples_per_prompt: int = 1,
    scorers: Collection[str] = (),
) -> dict[str, Any]:
    """Statistics of the whole run, from the merged file and the discard tombstones.

    Reads ``merge.path`` with polars (streaming; only ``tool_stats``, ``metadata.usage`` and
    ``metadata.reasoning`` are decoded) and ``run_dir/discarded.jsonl`` (one tombstone per
    prompt_id of the current dataset, ``index_of``, like the merged rows; a torn line is skipped).
    ``total_prompts`` is ``len(index_of)``.

    Returns:
        A dict with keys in this order: ``run_name, distribution, total_prompts, total_batches``
        (number of batch files), ``batch_size, model, completed_at`` (ISO-8601 UTC, seconds),
        ``duration_seconds`` (2 dp), ``tool_statistics`` (every tool of ``valid_tools``, sorted:
        ``{count, success, failure, success_rate, failure_rate}``, rates in percent, 2 dp, 0.0
        when unused), ``reasoning_statistics`` (``total_assistant_turns, turns_with_reasoning,
        turns_without_reasoning, coverage_percent``; the tombstones' assistant turns count as
        turns without reasoning), ``discarded_no_reasoning`` (tombstones), ``completed`` (rows
        in the merged file), ``failed`` (``len(failed_prompt_ids)``), ``filtered_hallucinated``,
        ``tokens {prompt, completion, reasoning, total}`` and ``cost_usd``. Tokens and cost sum
        the rows' and the tombstones' ``usage`` (tokens spent on discarded samples were paid
        for); ``total`` = prompt + completion (reasoning tokens are part of completion tokens);
        ``cost_usd`` is None when no row or tombstone reports a cost; ``scores`` (``{scorer:
        {scored, passed, failed, mean}}`` over the rows that scorer scored, see
        :mod:`hermes_core.scoring`; empty when none was scored); ``kept_by_filter`` (``{keep,
        kept, rejected}``: the merge's filter by score and its counts; the rejected rows, in
        ``rejected.jsonl``, count in the tools, reasoning, tokens, cost and scores, not in
        ``completed``); ``pass_at_k`` (``{"1": p, "<K>": p}`` for ``samples_per_prompt`` K: the
        unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
        ``1 - C(n - c, k) / C(n, k)`` for a record of n scored samples of which c passed, averaged
        over the records with at least k scored samples) and ``pass_hat_k`` (the share of records
        with K scored samples that all passed); both empty / None when no row was scored;
        ``flow_run_id`` names the
        flow run that wrote the file (so a reader can tell a stale file from this run's); ``merge``
        says what the merge left out besides hallucinated rows (``duplicates_dropped``, ``orphaned``:
        rows of records no longer in the dataset, ``torn_lines``).

    ``scorers`` names scorers besides the built-in ones (``python:module:function``) whose
    results the rows may hold; only named scorers count in ``scores``.

    Raises:
        OSError: a file cannot be read.
        polars.exceptions.PolarsError: the merged file is not valid NDJSON.
    """
    run_dir = Path(run_dir)
    tools = sorted(set(valid_tools))
    scored_by = [*SCORED_BY, *sorted(set(scorers) - set(SCORED_BY))]
    sums = _cached_row_sums(Path(merge.path), tools, scored_by)
    scored_files = [Path(merge.path)]
    if merge.rejected:  # rejected samples were run and paid for: their usage, tools and scores count
        rejected = _row_sums(RunFolder(run_dir).rejected, tools, scored_by)
        sums = {key: value + (rejected[key] if key != "rows" else 0) for key, value in sums.items()}
        scored_files.append(RunFolder(run_dir).rejected)
    scored = any(sums[f"score\0{scorer}\0scored"] for scorer in scored_by)
    # a second pass over the rows, per record, only for a run with scores
    pass_at_k, pass_hat_k = _pass_at_k(_pass_counts(scored_files) if scored else {}, samples_per_prompt)
    tomb = _tombstone_sums(RunFolder(run_dir).discarded, index_of)

    tool_statistics = {}
    for tool in tools:
        count, success, failure = (sums[f"{tool}\0{k}"] for k in ("count", "success", "failure"))
        tool_statistics[tool] = {
            "count": count,
            "success": success,
            "failure": failure,
            "success_rate": _percent(success, count),
            "failure_rate": _percent(failure, count),
        }
    total_turns = sums["assistant_turns"] + tomb["assistant_turns"]
    with_reasoning = sums["turns_with_reasoning"]
    prompt_tokens = sums["prompt_tokens"] + tomb["prompt_tokens"]
    completion_tokens = sums["completion_tokens"] + tomb["completion_tokens"]
    cost_reports = sums["cost_reports"] + tomb["cost_reports"]
    return {
        "run_name": run_name,
        "distribution": distribution,
        "total_prompts": len(index_of),
        "total_batches": len(batch_files(run_dir)),
        "batch_size": batch_size,
        "model": model,
        "completed_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_seconds": round(float(duration_seconds), 2),
        "tool_statistics": tool_statistics,
        "reasoning_statistics": {
            "total_assistant_turns": total_turns,
            "turns_with_reasoning": with_reasoning,
            "turns_without_reasoning": total_turns - with_reasoning,
            "coverage_percent": _percent(with_reasoning, total_turns),
        },
        "discarded_no_reasoning": tomb["count"],
        "completed": sums["rows"],
        "failed": len(failed_prompt_ids),
        "filtered_hallucinated": merge.filtered_hallucinated,
        "tokens": {
            "prompt": prompt_tokens,
            "completion": completion_tokens,
            "reasoning": sums["reasoning_tokens"] + tomb["reasoning_tokens"],
            "total": prompt_tokens + completion_tokens,
        },
        "cost_usd": round(sums["cost"] + tomb["cost"], 8) if cost_reports else None,
        "scores": _scores(sums, scored_by),
        "kept_by_filter": {"keep": merge.keep, "kept": sums["rows"], "rejected": merge.rejected},
        "pass_at_k": pass_at_k,
        "pass_hat_k": pass_hat_k,
        "merge": {
            "duplicates_dropped": merge.duplicates_dropped,
            "orphaned": merge.orphaned,
            "torn_lines": merge.torn_lines,
        },
        "flow_run_id": flow_run_id,
    }


def _pass_counts(paths: list[Path]) -> dict[int, list[int]]:
    """``{prompt_index: [scored samples, passed samples]}`` over the rows of ``paths`` that carry ``metadata.passed``."""
    schema = {"prompt_index": pl.Int64, "metadata": pl.Struct({"passed": pl.Boolean})}
    counts: dict[int, list[int]] = {}
    for path in paths:
        if not path.exists():
            continue
        for chunk in line_chunks(path, _CHUNK_BYTES):
            frame = pl.read_ndjson(chunk, schema=schema).select(
                pl.col("prompt_index"), pl.col("metadata").struct.field("passed").alias("passed")
            )
            grouped = frame.drop_nulls().group_by("prompt_index").agg(pl.len(), pl.col("passed").sum())
            for index, scored, passed in grouped.iter_rows():
                total = counts.setdefault(index, [0, 0])
                total[0] += scored
                total[1] += passed
    return counts


def _pass_at_k(counts: Mapping[int, list[int]], samples: int) -> tuple[dict[str, float], float | None]:
    """(``{"1": pass@1, "<samples>": pass@samples}``, pass^samples) of :func:`_pass_counts`' records (see compute_statistics)."""
    pass_at_k: dict[str, float] = {}
    for k in sorted({1, samples}):
        records = [(n, c) for n, c in counts.values() if n >= k]
        if records:
            estimate = sum(1 - math.comb(n - c, k) / math.comb(n, k) for n, c in records) / len(records)
            pass_at_k[str(k)] = round(estimate, 4)
    complete = [(n, c) for n, c in counts.values() if n >= samples]
    pass_hat_k = round(sum(c == n for n, c in complete) / len(complete), 4) if complete else None
    return pass_at_k, pass_hat_k


def _scores(sums: Mapping[str, Any], scored_by: list[str]) -> dict[str, dict[str, Any]]:
    """``{scorer: {scored, passed, failed, errored, mean}}`` of the scorers of ``scored_by`` that scored
    at least one row (``errored``: the scorer itself failed on the row, e.g. a ``python:`` function raised)."""
    scores = {}
    for scorer in scored_by:
        scored, passed = sums[f"score\0{scorer}\0scored"], sums[f"score\0{scorer}\0passed"]
        errored = sums.get(f"score\0{scorer}\0errored", 0)
        if scored:
            mean = round(sums[f"score\0{scorer}\0value"] / scored, 4)
            scores[scorer] = {
                "scored": scored,
                "passed": passed,
                "failed": scored - passed - errored,
                "errored": errored,
                "mean": mean,
            }
    return scores


def _percent(part: int, whole: int) -> float:
    """``part / whole`` in percent, 2 dp; 0.0 when ``whole`` is 0."""
    return round(part * 100 / whole, 2) if whole else 0.0


_COUNTS = pl.Struct({"count": pl.Int64, "success": pl.Int64, "failure": pl.Int64})
_USAGE = pl.Struct(
    {
        "prompt_tokens": pl.Int64,
        "completion_tokens": pl.Int64,
        "reasoning_tokens": pl.Int64,
        "cost": pl.Float64,
    }
)
_REASONING = pl.Struct({"assistant_turns": pl.Int64, "turns_with_reasoning": pl.Int64})
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "reasoning_tokens")
SCORED_BY = tuple(name for name in SCORERS if name != "auto")
"""The scorers whose results a row can hold (``metadata.score.<name>``)."""
_SCORE = pl.Struct({"value": pl.Float64, "passed": pl.Boolean, "errored": pl.Boolean})
_ROW_SUMS_VERSION = 3
"""Version of :func:`_row_sums`' keys in a merge state (2: the scores' sums; 3: named scorers)."""


def _row_sums(path: Path, tools: list[str], scorers: Collection[str] = SCORED_BY) -> dict[str, Any]:
    """Sum the per-row counters of the merged file, decoding only the needed fields with polars.

    The file is read in chunks of whole lines (~``_CHUNK_BYTES``; one longer line is one chunk)
    so memory stays bounded whatever the file size (polars' own NDJSON scan maps the whole file).

    Keys: ``rows``, ``<tool>\\0count|success|failure``, the usage token fields, ``cost`` and
    ``cost_reports`` (rows with a non-null cost), ``assistant_turns``, ``turns_with_reasoning``.
    Missing or null values count as 0.
    """
    schema: dict[str, pl.DataType] = {
        "metadata": pl.Struct(
            {"usage": _USAGE, "reasoning": _REASONING, "score": pl.Struct(dict.fromkeys(scorers, _SCORE))}
        ),
    }
    if tools:
        schema["tool_stats"] = pl.Struct(dict.fromkeys(tools, _COUNTS))
    usage = pl.col("metadata").struct.field("usage")
    reasoning = pl.col("metadata").struct.field("reasoning")
    exprs = [pl.len().alias("rows")]
    for tool in tools:
        stats = pl.col("tool_stats").struct.field(tool)
        exprs += [stats.struct.field(k).sum().alias(f"{tool}\0{k}") for k in ("count", "success", "failure")]
    exprs += [usage.struct.field(k).sum().alias(k) for k in _USAGE_FIELDS]
    exprs += [
        usage.struct.field("cost").sum().alias("cost"),
        usage.struct.field("cost").count().alias("cost_reports"),
        reasoning.struct.field("assistant_turns").sum().alias("assistant_turns"),
        reasoning.struct.field("turns_with_reasoning").sum().alias("turns_with_reasoning"),
    ]
    for scorer in scorers:
        score = pl.col("metadata").struct.field("score").struct.field(scorer)
        exprs += [
            score.struct.field("passed").count().alias(f"score\0{scorer}\0scored"),
            score.struct.field("passed").sum().alias(f"score\0{scorer}\0passed"),
            score.struct.field("value").sum().alias(f"score\0{scorer}\0value"),
            score.struct.field("errored").sum().alias(f"score\0{scorer}\0errored"),
        ]
    totals: dict[str, Any] = {str(e.meta.output_name()): 0 for e in exprs}
    totals["cost"] = 0.0
    for chunk in line_chunks(path, _CHUNK_BYTES):
        partial = pl.read_ndjson(chunk, schema=schema).select(exprs).row(0, named=True)
        for name, value in partial.items():
            totals[name] += value or 0
    return totals


def _cached_row_sums(path: Path, tools: list[str], scorers: list[str]) -> dict[str, Any]:
    """:func:`_row_sums` of ``path``, remembered in its merge state while the file is unchanged."""
    state = _read_state(path)
    cached = state.get("row_sums")
    if (
        cached
        and cached.get("file") == _signature(path)
        and cached.get("tools") == tools
        and cached.get("scorers") == scorers
        and cached.get("version") == _ROW_SUMS_VERSION
    ):
        return cached["sums"]
    sums = _row_sums(path, tools, scorers)
    if state:  # only a merged file with a state (made by merge_trajectories) gets its sums remembered
        remembered = {
            "file": _signature(path),
            "tools": tools,
            "scorers": scorers,
            "version": _ROW_SUMS_VERSION,
            "sums": sums,
        }
        _write_state(path, {**state, "row_sums": remembered})
    return sums


def _tombstone_sums(path: Path, index_of: Mapping[str, int]) -> dict[str, Any]:
    """Count the tombstones of ``discarded.jsonl`` (first per prompt_id of ``index_of``) and sum their turns and usage."""
    sums: dict[str, Any] = {
        "count": 0,
        "assistant_turns": 0,
        **dict.fromkeys(_USAGE_FIELDS, 0),
        "cost": 0.0,
        "cost_reports": 0,
    }
    if not path.exists():
        return sums
    seen: set[str] = set()
    for _, raw, line_no, is_last in iter_raw_lines(path):
        tomb = loads_object(raw)
        if tomb is None:
            if not is_last:
                log.warning("%s line %d is not a JSON object; skipped", path, line_no)
            continue
        prompt_id = tomb.get("prompt_id")
        if not isinstance(prompt_id, str) or prompt_id not in index_of or prompt_id in seen:
            continue
        seen.add(prompt_id)
        sums["count"] += 1
        sums["assistant_turns"] += _int(tomb.get("assistant_turns"))
        usage = tomb.get("usage") if isinstance(tomb.get("usage"), dict) else {}
        for name in _USAGE_FIELDS:
            sums[name] += _int(usage.get(name))
        cost = usage.get("cost")
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            sums["cost"] += float(cost)
            sums["cost_reports"] += 1
    return sums


def _int(value: Any) -> int:
    """An integer counter from JSON; anything else (null, missing) is 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class _FilePool:
    """Random-access reads over the batch files with a small LRU of open handles."""

    def __init__(self, files: list[Path]):
        self._files = files
        self._open: OrderedDict[int, IO[bytes]] = OrderedDict()

    def __enter__(self) -> _FilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        for fh in self._open.values():
            fh.close()
        self._open.clear()

    def read(self, file_no: int, offset: int, length: int) -> bytes:
        fh = self._open.get(file_no)
        if fh is None:
            if len(self._open) >= _MAX_OPEN_FILES:
                self._open.popitem(last=False)[1].close()
            fh = self._open[file_no] = open(self._files[file_no], "rb")
        else:
            self._open.move_to_end(file_no)
        fh.seek(offset)
        return fh.read(length)
