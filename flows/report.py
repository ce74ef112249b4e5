"""The end of a run: merge, close the invocation, statistics; and the live run-wide figures.

:func:`finish_run` is the one sequence that turns a run folder's ledger into its outputs. The
flow calls it with Prefect tasks (``merge-trajectories``, ``compute-statistics``);
``bench/resume.py`` calls it without Prefect (``in_flow=False``: the tasks' plain functions).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prefect.utilities.annotations import quote

from flows.budget import Budget, projection
from flows.config import BatchConfig
from hermes_core.runfolder.run_info import RunInfo, finish_invocation
from tasks.compress import StrictGuard, compress_task
from tasks.merge import merge_task
from tasks.statistics import statistics_task


def finish_run(
    config: BatchConfig,
    info: RunInfo,
    index_of: Mapping[str, int],
    failed_ids: list[str],
    *,
    started: float,
    facts: Mapping[str, Any],
    run_control: dict[str, Any] | None = None,
    in_flow: bool = True,
    samples_skipped: int | None = None,
    limiter=None,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """Merge the batch files, compress them (``--compress_to_tokens``), record the invocation's end
    in run.json, write statistics.json.

    Args:
        config: the run's options.
        info: run.json as this invocation opened it.
        index_of: prompt_id -> prompt_index of the current dataset.
        failed_ids: prompt_ids that failed in this invocation.
        started: ``time.monotonic()`` when this invocation started (its duration ends after the merge).
        facts: counts recorded with the invocation (``ran``, ``failed``, ``budget_reached``).
        run_control: extra statistics keys (``budget``, ``concurrency``).
        in_flow: run the merge and the statistics as Prefect tasks (inside a flow run); False
            calls their functions directly (no Prefect API needed).
        samples_skipped: with ``--stop_when_passed``, the samples held back now (pending, of a
            record with a passing row); None without the option.
        limiter / budget: the run's request limiter and spend cap, which the compression's
            summary requests take (None: no limit, no cap).

    Returns:
        The statistics (what statistics.json holds).
    """
    # in a flow run: Prefect tasks, index_of quoted (Prefect would walk every entry looking for
    # futures, twice per task call: ~14 s at 10^6 prompts, bench/ANALYSIS.md); else their functions
    merge_step, statistics_step = (
        (merge_task, statistics_task) if in_flow else (merge_task.fn, statistics_task.fn)
    )
    indexes = quote(index_of) if in_flow else index_of
    merge = merge_step(config.run_dir, indexes, config.keep)
    if config.compress_to_tokens:
        compress_step = compress_task if in_flow else compress_task.fn
        guard = StrictGuard(budget) if budget is not None and budget.capped else None
        compression = compress_step(config, limiter, guard)
        run_control = {**(run_control or {}), "compression": compression}
    finish_invocation(info, duration_s=round(time.monotonic() - started, 3), **facts)
    return statistics_step(
        config, merge, indexes, info.total_duration, failed_ids, run_control, samples_skipped
    )


def run_meter(config: BatchConfig, budget: Budget, limiter, total: int):
    """The run-wide figures of the live progress, as a function (O(1) per call).

    Returns:
        A function returning ``{run_tokens, run_cost, projected_tokens, projected_cost,
        max_cost_usd, max_total_tokens, limit, rate_limited}`` (spend over every invocation, its
        projection to ``total`` prompts, the caps, the request limiter's state or None).
    """

    def figures() -> dict[str, Any]:
        spent = budget.spent
        projected = projection(
            spent, spent.records, total, config.price_per_mtok_in, config.price_per_mtok_out
        )
        return {
            "run_tokens": spent.total_tokens,
            "run_cost": budget.cost,
            "projected_tokens": projected["tokens"],
            "projected_cost": projected["cost_usd"],
            "max_cost_usd": config.max_cost_usd,
            "max_total_tokens": config.max_total_tokens,
            "limit": limiter.limit if limiter else None,
            "rate_limited": limiter.rate_limited if limiter else None,
        }

    return figures
