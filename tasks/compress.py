"""The ``compress-trajectories`` task: ``trajectories.jsonl`` -> ``trajectories_compressed.jsonl`` (``--compress_to_tokens``).

Runs after the merge when ``--compress_to_tokens`` is set (:func:`flows.report.finish_run`). Each
row over the budget gets a middle region of turns replaced by one summary turn
(:mod:`hermes_core.compression`; README § Compressing to a token budget). The summariser's
requests take the run's request limiter and its spend cap; its usage is the run's. Rows are
cached one by one in ``compression.jsonl``: a resumed or retried flow run pays no summary twice
and a change of budget or tokenizer compresses again only the rows whose result changes.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from hermes_core.compression import ModelSummariser, compress_jsonl, load_tokenizer
from hermes_core.exceptions import PromptCancelled
from hermes_core.runfolder.folder import RunFolder
from tasks.prompt import settings_of


class StrictGuard:
    """The spend cap as the summaries' guard: no summary request once the cap is reached, whatever
    ``--on_budget`` says (the prompts are over; a summary is never worth passing the cap for).

    Args:
        budget: the run's :class:`~flows.budget.Budget` (its ``before_request`` / ``after_request``).
    """

    def __init__(self, budget):
        self.budget = budget

    def before_request(self) -> None:
        """Raise PromptCancelled when the cap is reached or the next request would pass it."""
        self.budget.before_request()
        if self.budget.reached:
            raise PromptCancelled("the spend cap is reached: no summary request is sent")

    def after_request(self, usage) -> None:
        """Count a summary's usage in the run's spend."""
        self.budget.after_request(usage)


@task(name="compress-trajectories", persist_result=False)
def compress_task(config, limiter=None, guard=None) -> dict[str, Any] | None:
    """Compress the run's merged rows to ``config.compress_to_tokens``; the metrics' totals, or None.

    Args:
        config: the run's :class:`~flows.config.BatchConfig` (``compress_to_tokens`` and ``tokenizer`` set).
        limiter: the run's request limiter (:mod:`hermes_core.limiter`), or None.
        guard: the run's spend cap (:mod:`hermes_core.spend_guard`), or None.

    Returns:
        ``compression_metrics.json``'s ``totals``; None when the spend cap stopped the compression
        (what was summarised is cached: a resume with a higher cap goes on).

    Raises:
        TokenizerError: the tokenizer does not load (checked before the run's first prompt too).
        CompressionInputError: trajectories.jsonl holds a line that is not a row.
    """
    folder = RunFolder(config.run_dir)
    summarise = ModelSummariser(
        config.summary_model or config.model,
        config.summary_base_url or config.base_url,
        settings_of(config.api_key_secret),
        limiter=limiter,
        guard=guard,
    )
    try:
        metrics = compress_jsonl(
            folder.trajectories,
            out=folder.compressed,
            cache_path=folder.compression_cache,
            metrics_path=folder.compression_metrics,
            counter=load_tokenizer(config.tokenizer),
            settings=config.compression_settings(),
            summarise=summarise,
            workers=config.num_workers,
        )
    except PromptCancelled as exc:
        get_run_logger().warning(
            "compression stopped: %s; the rows summarised so far are cached, a resume goes on", exc
        )
        return None
    return metrics["totals"]


__all__ = ["StrictGuard", "compress_task"]
