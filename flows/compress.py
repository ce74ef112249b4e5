"""``hermes-batch compress data/<run>``: compress a finished run's rows to a token budget.

Reads the run's ``trajectories.jsonl`` and writes ``trajectories_compressed.jsonl`` and
``compression_metrics.json`` beside it, with the per-row cache ``compression.jsonl``
(:mod:`hermes_core.compression`; README § Compressing to a token budget). It holds the run
folder's lock (:class:`~hermes_core.runfolder.ledger.RunLock`): it does not run beside a run, a
``score`` or another ``compress`` of the same folder. Safe to kill and run again: no summary is
paid twice. The summary model and endpoint default to the run's (``run.json``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hermes_core.compression import (
    CompressionInputError,
    CompressionSettings,
    ModelSummariser,
    TokenizerError,
    compress_jsonl,
    load_tokenizer,
)
from hermes_core.exceptions import ConfigError
from hermes_core.limiter import ConcurrencyLimiter
from hermes_core.redaction import register_secrets_of
from hermes_core.runfolder.folder import RunFolder
from hermes_core.runfolder.ledger import RunInUseError, RunLock
from hermes_core.runfolder.run_info import read_run_info
from hermes_core.settings import HermesSettings

__all__ = ["CompressError", "compress_run", "describe", "main"]


class CompressError(ValueError):
    """Bad input of ``hermes-batch compress`` (not a run folder, no trajectories.jsonl yet)."""


def compress_run(
    run_dir: Path,
    tokenizer: str,
    settings: CompressionSettings,
    *,
    summary_base_url: str | None = None,
    workers: int = 8,
    hermes_settings: HermesSettings | None = None,
) -> dict[str, Any]:
    """Compress ``run_dir``'s ``trajectories.jsonl``; returns the metrics (``compression_metrics.json``).

    Args:
        tokenizer: a ``tokenizer.json`` path or a Hub id (:func:`hermes_core.compression.load_tokenizer`).
        settings: the compression's settings; an empty ``summary_model`` means the run's model.
        summary_base_url: the summariser's endpoint (default: the run's, else the model's default).
        workers: rows at once; also the limit of summary requests in flight.
        hermes_settings: key, timeout and retries (default: from the environment).

    Raises:
        CompressError: not a run folder, or it has no trajectories.jsonl.
        TokenizerError: the tokenizer does not load.
        CompressionInputError: a line of trajectories.jsonl is not a ShareGPT row.
        RunInUseError: a run, score or compress holds the folder.
        ConfigError: no API key for a remote summary endpoint.
    """
    folder = RunFolder(run_dir)
    info = read_run_info(run_dir)
    if info is None:
        raise CompressError(f"{run_dir}: not a run folder (no {folder.run_json.name})")
    if not folder.trajectories.is_file():
        raise CompressError(f"{run_dir}: no {folder.trajectories.name} yet (finish or resume the run first)")
    counter = load_tokenizer(tokenizer)
    defining = info.data.get("defining", {})
    model = settings.summary_model or defining.get("model") or "mock/summariser"
    settings = CompressionSettings(**{**vars(settings), "summary_model": model})
    hermes_settings = hermes_settings or HermesSettings()
    register_secrets_of(hermes_settings)
    summarise = ModelSummariser(
        model,
        summary_base_url or defining.get("base_url"),
        hermes_settings,
        limiter=ConcurrencyLimiter(workers),
    )
    with RunLock(run_dir):
        return compress_jsonl(
            folder.trajectories,
            out=folder.compressed,
            cache_path=folder.compression_cache,
            metrics_path=folder.compression_metrics,
            counter=counter,
            settings=settings,
            summarise=summarise,
            workers=workers,
        )


def describe(metrics: dict[str, Any]) -> str:
    """The command's summary lines: rows by status, tokens before/after, the summariser's requests, the time."""
    t = metrics["totals"]
    lines = [
        f"Compressed {t['compressed']} row(s) to the target; {t['untouched']} already under it (untouched); "
        f"{t['still_over']} still over; {t['failed']} failed; {t['dropped']} dropped"
        + (f"; {t['not_sampled']} not sampled" if t["not_sampled"] else "")
        + ".",
        f"Tokens: {t['tokens_before']} before, {t['tokens_after']} after, {t['tokens_saved']} saved "
        f"(ratio {t['overall_ratio']}).",
        f"Summariser: {t['summariser_calls_this_run']} request(s) now ({t['summariser_errors_this_run']} failed); "
        f"{t['from_cache']} row(s) from the cache. {t['duration_seconds']} s.",
    ]
    return "\n".join(lines)


def main(args: Any) -> int:
    """Run ``compress`` from parsed arguments (:func:`flows.commands.build_compress_parser`); the exit code.

    0: done; 1: some rows failed to summarise (kept uncompressed; run again to retry them);
    2: bad input (one line ``error: ...``).
    """
    settings = CompressionSettings(
        target_max_tokens=args.target_max_tokens,
        protect_last_n_turns=args.protect_last_n_turns,
        summary_target_tokens=args.summary_target_tokens,
        summary_notice=not args.no_summary_notice,
        summary_model=args.summary_model or "",
        drop_over_limit=args.drop_over_limit,
        sample_percent=args.sample_percent,
        seed=args.seed,
    )
    try:
        metrics = compress_run(
            Path(args.run_dir),
            args.tokenizer,
            settings,
            summary_base_url=args.summary_base_url,
            workers=args.num_workers,
        )
    except (CompressError, TokenizerError, CompressionInputError, RunInUseError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(metrics))
    failed = metrics["totals"]["failed"]
    if failed:
        print(
            f"error: {failed} row(s) could not be summarised and are kept uncompressed "
            f"(see compression_metrics.json); run compress again to retry them",
            file=sys.stderr,
        )
        return 1
    return 0
