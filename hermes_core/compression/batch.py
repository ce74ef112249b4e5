"""Compress a JSONL file of ShareGPT rows, cached per row: the work behind ``hermes-batch compress``.

:func:`compress_jsonl` reads the rows in order (streaming: a window of ``2 x workers`` rows in
memory), compresses each (:func:`~hermes_core.compression.algorithm.compress_row`, ``workers``
at a time) and writes, atomically at the end, the output (rows in input order; untouched rows
byte for byte) and the metrics JSON.

**The cache** (a JSONL file, append-only): one line per row result, ``{row, tokenizer,
turn_tokens, key, status, region, summary, tokens_after, turns_after, calls, errors, usage, error,
time}``. ``row`` is the sha256 of the row's bytes (32 hex), ``key`` the
:func:`~hermes_core.compression.algorithm.settings_key` (null for a row at or under the target:
its line only records the token counts). A line whose summariser was called is fsynced before
the next row is taken; a torn last line (a killed writer) is cut when the cache is opened. So:

- a killed compression loses no paid summary and the next one sends no request for the rows
  already done (their results are read back and the rows rebuilt from their region and summary);
- rows whose counts are known are not tokenized again (counts are per tokenizer fingerprint);
- a change of target: rows under the new target cost nothing; the others are compressed again
  only when their key changed (the key includes the target); a failed row (``status: failed``)
  is tried again on the next run.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hermes_core.compression.algorithm import (
    CompressionSettings,
    RowResult,
    compress_row,
    finish,
    settings_key,
)
from hermes_core.compression.summariser import Summariser
from hermes_core.compression.tokens import TokenCounter
from hermes_core.redaction import clean_for_storage
from hermes_core.runfolder.files import (
    append_jsonl,
    atomic_writer,
    iter_raw_lines,
    loads_object,
    repair_torn_tail,
    write_json_atomic,
)
from hermes_core.usage import Usage

__all__ = ["STATUSES", "CompressionInputError", "compress_jsonl", "read_cache"]

STATUSES = ("compressed", "untouched", "still_over", "failed", "dropped")
"""Per-row statuses of the metrics (``dropped``: still over with ``drop_over_limit``)."""


class CompressionInputError(ValueError):
    """The input cannot be compressed: a missing file, or a line that is not a ShareGPT row (named)."""


@dataclass
class _Cache:
    """What the cache file says: token counts per (row, tokenizer), results per settings key."""

    counts: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_cache(path: Path) -> _Cache:
    """Read a cache file (missing: empty); a torn last line is cut first, other unreadable lines are skipped.

    Raises:
        OSError: the file cannot be read or repaired.
    """
    cache = _Cache()
    if not Path(path).exists():
        return cache
    repair_torn_tail(path)
    for _offset, raw, _no, _last in iter_raw_lines(path):
        line = loads_object(raw)
        if not line or not isinstance(line.get("turn_tokens"), list):
            continue
        cache.counts[(line.get("row"), line.get("tokenizer"))] = line["turn_tokens"]
        if line.get("key") and line.get("status") in ("compressed", "still_over"):
            line.pop("turn_tokens")
            cache.results[line["key"]] = line
    return cache


def compress_jsonl(
    src: Path,
    *,
    out: Path,
    cache_path: Path,
    metrics_path: Path,
    counter: TokenCounter,
    settings: CompressionSettings,
    summarise: Summariser,
    workers: int = 8,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Compress the rows of ``src`` into ``out``; write the metrics to ``metrics_path`` and return them.

    Args:
        src: JSONL, one ShareGPT row (a dict with ``conversations``) per line.
        out: the output JSONL (replaced atomically when every row is done).
        cache_path: the per-row cache (see the module docstring); appended to.
        metrics_path: the metrics JSON: ``{"totals": {...}, "rows": [per-row metrics]}`` (README).
        workers: rows compressed at once (summary requests in flight).
        progress: called with the number of rows done after each row.

    Raises:
        CompressionInputError: ``src`` is missing, or a line is not a ShareGPT row (what was
            summarised before is in the cache; nothing is written to ``out``).
        PromptCancelled: the summariser's spend guard stopped the work (the same).
        OSError: a file cannot be read or written.
    """
    src = Path(src)
    if not src.is_file():
        raise CompressionInputError(f"{src}: no such file")
    started, started_at = time.monotonic(), _now()
    cache = read_cache(cache_path)
    sample = _sample(src, settings) if settings.sample_percent is not None else None
    state = _Run(counter, settings, summarise, cache)
    rows: list[dict[str, Any]] = []
    in_file = 0
    with (
        open(cache_path, "ab") as cache_fh,
        atomic_writer(out) as out_fh,
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="compress") as pool,
    ):
        state.cache_fh = cache_fh
        window: deque[Future] = deque()
        for _offset, raw, line_no, _last in iter_raw_lines(src):
            in_file += 1
            if sample is not None and line_no not in sample:
                continue
            window.append(pool.submit(state.row, raw, line_no))
            while len(window) >= 2 * workers:
                _write(window.popleft().result(), out_fh, rows, progress)
        while window:
            _write(window.popleft().result(), out_fh, rows, progress)
        cache_fh.flush()
    metrics = {
        "totals": _totals(rows, in_file, state, started_at, time.monotonic() - started),
        "settings": {
            "tokenizer": counter.spec,
            "tokenizer_fingerprint": counter.fingerprint,
            **{k: v for k, v in vars(settings).items()},
        },
        "rows": rows,
    }
    write_json_atomic(metrics_path, metrics)
    return metrics


class _Run:
    """One compression's shared state: the cache (read and appended) and this run's spend."""

    def __init__(self, counter: TokenCounter, settings: CompressionSettings, summarise: Summariser, cache):
        self.counter, self.settings, self.summarise, self.cache = counter, settings, summarise, cache
        self.cache_fh: IO[bytes] | None = None
        self.lock = threading.Lock()
        self.calls = self.errors = self.from_cache = 0
        self.usage = Usage()

    def row(self, raw: bytes, line_no: int) -> tuple[bytes | None, dict[str, Any]]:
        """(the output line or None when dropped, the row's metrics) of one input line."""
        row = loads_object(raw)
        turns = row.get("conversations") if row else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise CompressionInputError(
                f"line {line_no}: not a ShareGPT row (no list of turns in 'conversations')"
            )
        digest = hashlib.sha256(raw).hexdigest()[:32]
        fingerprint, settings = self.counter.fingerprint, self.settings
        counts = self.cache.counts.get((digest, fingerprint))
        known = counts is not None
        counts = list(counts) if known else self.counter.count_turns(turns)
        key = (
            settings_key(digest, fingerprint, settings) if sum(counts) > settings.target_max_tokens else None
        )
        hit = self.cache.results.get(key) if key else None
        if hit is not None:
            result = _from_cache(hit, turns, counts, self.counter, settings)
        elif key is None:
            result = RowResult("untouched", sum(counts), sum(counts), len(turns), len(turns), counts)
        else:
            result = compress_row(turns, self.counter, settings, self.summarise, counts)
        if hit is None and (key is not None or not known):
            self._record(digest, key, result)
        dropped = result.status == "still_over" and settings.drop_over_limit
        if dropped or result.conversations is None:
            line = None if dropped else raw
        else:
            line = json.dumps(
                clean_for_storage({**row, "conversations": result.conversations}), ensure_ascii=False
            )
            line = line.encode("utf-8")
        metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        return line, _row_metrics(line_no, row, metadata, result, dropped, hit is not None)

    def _record(self, digest: str, key: str | None, result: RowResult) -> None:
        """Append the row's cache line (fsynced when the summariser was called) and count its spend."""
        line = {
            "row": digest,
            "tokenizer": self.counter.fingerprint,
            "turn_tokens": result.turn_tokens,
            "key": key,
            "status": result.status,
            "region": list(result.region) if result.region else None,
            "summary": result.summary,
            "tokens_after": result.tokens_after,
            "turns_after": result.turns_after,
            "calls": result.calls,
            "errors": result.errors,
            "usage": result.usage.as_dict() if result.usage else None,
            "error": result.error,
            "time": _now(),
        }
        with self.lock:
            self.calls += result.calls
            self.errors += result.errors
            if result.usage:
                self.usage.add(result.usage)
            assert self.cache_fh is not None
            if result.calls:
                append_jsonl(self.cache_fh, line)
            else:  # only counts: losing it costs a tokenization, not a request
                self.cache_fh.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))


def _from_cache(
    hit: dict[str, Any], turns: list[dict[str, Any]], counts: list[int], counter, settings
) -> RowResult:
    """The row's result rebuilt from its cache line (no request)."""
    total = sum(counts)
    result = RowResult("still_over", total, total, len(turns), len(turns), counts)
    result.calls, result.errors = hit.get("calls") or 0, hit.get("errors") or 0
    result.usage = Usage.from_dict(hit["usage"]) if hit.get("usage") else None  # paid before, not now
    if hit.get("region") and hit.get("summary") is not None:
        result.region, result.summary = tuple(hit["region"]), hit["summary"]
        finish(result, turns, counter, settings)
    return result


def _row_metrics(
    line_no: int,
    row: dict[str, Any],
    metadata: dict[str, Any],
    result: RowResult,
    dropped: bool,
    cached: bool,
) -> dict[str, Any]:
    region = None
    if result.region:
        start, until = result.region
        region = {"first": start, "last": until - 1, "turns": until - start}
    return {
        "line": line_no,
        "prompt_index": row.get("prompt_index"),
        "prompt_id": metadata.get("prompt_id"),
        "status": "dropped" if dropped else result.status,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "turns_before": result.turns_before,
        "turns_after": result.turns_after,
        "region": region,
        "summarised": result.summary is not None,
        "summariser_calls": result.calls,
        "summariser_errors": result.errors,
        "summariser_usage": result.usage.as_dict() if result.usage else None,
        "cached": cached,
        "error": result.error,
    }


def _write(done, out_fh: IO[bytes], rows: list[dict[str, Any]], progress) -> None:
    line, metrics = done
    if line is not None:
        out_fh.write(line + b"\n")
    rows.append(metrics)
    if progress is not None:
        progress(len(rows))


def _sample(src: Path, settings: CompressionSettings) -> set[int]:
    """The line numbers of the seeded sample: ``max(1, int(n x p / 100))`` of the n rows (the reference's count)."""
    lines = [line_no for _o, _r, line_no, _l in iter_raw_lines(src)]
    k = min(len(lines), max(1, int(len(lines) * float(settings.sample_percent or 0) / 100)))
    return set(random.Random(settings.seed).sample(lines, k)) if lines else set()


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _totals(
    rows: list[dict[str, Any]], in_file: int, run: _Run, started_at: str, duration: float
) -> dict[str, Any]:
    written = [r for r in rows if r["status"] != "dropped"]
    summarised = [r for r in rows if r["summarised"]]
    before = sum(r["tokens_before"] for r in rows)
    after = sum(r["tokens_after"] for r in written)
    by_status = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    return {
        "rows_in_file": in_file,
        "rows": len(rows),
        "not_sampled": in_file - len(rows),
        **by_status,
        "skipped": by_status["untouched"],
        "rows_written": len(written),
        "tokens_before": before,
        "tokens_after": after,
        "tokens_saved": before - after,
        "overall_ratio": round(after / before, 4) if before else None,
        "turns_before": sum(r["turns_before"] for r in rows),
        "turns_after": sum(r["turns_after"] for r in written),
        "averages": {
            "tokens_before_per_row": _mean([r["tokens_before"] for r in rows]),
            "tokens_after_per_written_row": _mean([r["tokens_after"] for r in written]),
            "ratio_per_summarised_row": _mean([r["tokens_after"] / r["tokens_before"] for r in summarised]),
            "tokens_saved_per_summarised_row": _mean(
                [r["tokens_before"] - r["tokens_after"] for r in summarised]
            ),
            "turns_removed_per_summarised_row": _mean(
                [r["turns_before"] - r["turns_after"] for r in summarised]
            ),
        },
        "summarised": len(summarised),
        "from_cache": sum(r["cached"] for r in rows),
        "summariser_calls": sum(r["summariser_calls"] for r in rows),
        "summariser_errors": sum(r["summariser_errors"] for r in rows),
        "summariser_calls_this_run": run.calls,
        "summariser_errors_this_run": run.errors,
        "usage_this_run": run.usage.as_dict(),
        "started_at": started_at,
        "duration_seconds": round(duration, 3),
    }


def describe_compression(totals: dict[str, Any]) -> str:
    """One line of a compression's totals, e.g. ``3 compressed, 7 untouched, 0 still over, 0 failed ·
    tokens 91000 -> 40000 (ratio 0.44)``."""
    dropped = f", {totals['dropped']} dropped" if totals.get("dropped") else ""
    return (
        f"{totals['compressed']} compressed, {totals['untouched']} untouched, {totals['still_over']} still over, "
        f"{totals['failed']} failed{dropped} · tokens {totals['tokens_before']} -> {totals['tokens_after']} "
        f"(ratio {totals['overall_ratio']})"
    )


def _now() -> str:
    from hermes_core.trajectory import timestamp_now

    return timestamp_now()
