"""The ``generate-trajectories`` flow: dataset -> per-prompt tasks -> ledger -> merge -> statistics.

Reads top to bottom like the job it does. ``num_workers`` prompts are in flight
at once in a sliding window (a finished prompt makes room for the next: no
batch waits for its slowest prompt). Results come back to this flow, which is
the ledger's only writer. A retried flow run (the Prefect UI's Retry) continues
the same run: finished prompts are skipped by the ledger or come from the task
cache, failed ones run again. Ctrl-C, SIGTERM and a Cancel in Prefect stop it the
same way (:mod:`flows.stopping`): it records what finished and ends Cancelled.
A spend cap (:mod:`flows.budget`) that would be crossed starts no new prompt; the run
drains (or cancels) what runs, writes every output and ends Failed named
``BudgetReached``. ``--pilot N`` runs N drawn prompts and writes ``pilot.json``
(:mod:`flows.pilot`).
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext
from prefect.runtime import flow_run
from prefect.states import Cancelled, Completed, Failed, State
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from flows import pilot as pilot_run
from flows.budget import Budget
from flows.config import BatchConfig, options_docstring, options_signature
from flows.progress import RunProgress, artifact_key, meter_text
from flows.stopping import RunStop
from flows.tuning import limit_malloc_arenas, local_dask_cluster_settings, tune_garbage_collector
from hermes_core import cancel, spend_guard
from hermes_core.endpoints import resolve_backend
from hermes_core.environments import isolation_warning, network_warning
from hermes_core.exceptions import PromptCancelled
from hermes_core.limiter import run_limiter
from hermes_core.runner import PromptJob, PromptOutcome, unavailable_tools
from hermes_core.settings import HermesSettings
from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tasks.dataset import Dataset, DatasetError, read_dataset
from tasks.images import prepare_sandboxes
from tasks.ledger import RunLedger, RunLock
from tasks.postprocess import compute_statistics, merge_trajectories, write_json_atomic
from tasks.prompt import retry_condition, run_prompt_task, settle_failed_usage
from tasks.run_setup import (
    check_run_dir,
    finish_invocation,
    iter_jobs,
    prompt_ids,
    refused_cwds,
    start_invocation,
)


@task(name="read-dataset", persist_result=False)
def read_dataset_task(config: BatchConfig) -> Dataset:
    """Read and validate the JSONL dataset (line-numbered errors; ``skip_invalid`` skips them)."""
    dataset = read_dataset(
        config.dataset_file, max_samples=config.max_samples, skip_invalid=config.skip_invalid, reuse=True
    )
    refused = refused_cwds(config, dataset, HermesSettings())
    if refused:
        raise DatasetError(
            config.dataset_file, f"{len(refused)} record(s) with a cwd the local sandbox refuses", refused
        )
    for line, reason in dataset.invalid:
        get_run_logger().warning("skipped invalid line %s of %s: %s", line, config.dataset_file, reason)
    return dataset


@task(name="merge-trajectories", persist_result=False)
def merge_task(run_dir: Path, index_of: dict[str, int]):
    """Merge batch files into trajectories.jsonl (ordered, deduplicated, hallucinated tools filtered)."""
    return merge_trajectories(run_dir, index_of=index_of, valid_tools=ALL_POSSIBLE_TOOLS)


@task(name="compute-statistics", persist_result=False)
def statistics_task(
    config: BatchConfig,
    merge,
    index_of: dict[str, int],
    duration: float,
    failed: list[str],
    run_control: dict | None = None,
) -> dict:
    """Statistics of the whole run, written to statistics.json (with ``run_control``'s keys: budget, concurrency)."""
    stats = compute_statistics(
        config.run_dir,
        merge=merge,
        run_name=config.run_name,
        distribution=config.distribution,
        model=config.model,
        batch_size=config.batch_size,
        index_of=index_of,
        duration_seconds=duration,
        failed_prompt_ids=failed,
        valid_tools=ALL_POSSIBLE_TOOLS,
        flow_run_id=str(flow_run.id) if flow_run.id else None,
    )
    stats.update(run_control or {})
    write_json_atomic(config.run_dir / "statistics.json", stats)
    return stats


def _generate_trajectories(**options: Any) -> State:
    """Run every prompt of a JSONL dataset through the Hermes agent and write ShareGPT trajectories.

    One parameter per option (the flags of ``batch_runner.py``; see each parameter's description).
    Ends Completed; Failed (after every output is written) when prompts failed, with a message
    that gives the count and says that a retry re-attempts only those; Cancelled when it was
    stopped (Ctrl-C, SIGTERM, Cancel in Prefect): finished prompts are on disk, the merge and
    statistics are left to the next invocation.
    """
    config = BatchConfig.from_options(**options)
    logger = get_run_logger()
    started = time.monotonic()
    limit_malloc_arenas()  # before the prompt threads start
    tune_garbage_collector()  # the modules are imported by now
    scheduled = flow_run.scheduled_start_time
    config = config.for_date(scheduled.date() if scheduled else datetime.now(UTC).date())
    retried = (flow_run.run_count or 1) > 1  # a retry of this flow run continues the same run
    resume = config.resume or retried
    run_dir = config.run_dir
    cancel.hold_new_prompts(False)  # a budget stop of an earlier flow run in this process is over
    with RunStop(flow_run.id) as stop, RunLock(run_dir):
        check_run_dir(
            run_dir, config.defining_settings(), resume=resume, overwrite=config.overwrite and not retried
        )
        dataset = read_dataset_task(config)
        ids = prompt_ids(dataset, config.settings_hash())  # records stay on disk until their prompt starts
        info = start_invocation(
            run_dir, config.run_name, config.defining_settings(), config.settings_hash(), dataset, flow_run.id
        )
        ledger = RunLedger.open(run_dir, config.run_name)
        if ledger.torn_bytes:
            logger.warning("repaired a torn last line (%d bytes) left by a killed run", ledger.torn_bytes)
        finished = ledger.finished
        everyone = range(len(ids))
        drawn = pilot_run.draw(everyone, config.pilot, config.seed) if config.pilot else everyone
        pending = [index for index in drawn if ids[index] not in finished]
        del finished
        index_of = {pid: index for index, pid in enumerate(ids)}
        done_before = len(ids) - len(pending)
        ledger.plan([(index, ids[index]) for index in pending], config.batch_size, index_of)
        # docker: reap leftovers, check images
        backend = resolve_backend(config.terminal_env, HermesSettings())
        pending, image_failed = prepare_sandboxes(info.run_id, pending, dataset, ids, backend, ledger)
        settings = HermesSettings()
        warnings = [
            w for w in (isolation_warning(backend, settings), network_warning(backend, settings)) if w
        ]
        for warning in warnings:
            logger.warning("%s", warning)
        for tool, reason in sorted(unavailable_tools(config.distribution, HermesSettings()).items()):
            logger.info("tool %s not offered: %s", tool, reason)
        start_line = (
            f"run {config.run_name}: {len(ids)} prompts, {done_before} already finished, "
            f"{len(pending)} to run with {config.num_workers} workers"
        )
        logger.info("%s", start_line)
        budget = Budget.of(config, ledger.spend)
        limiter = (
            run_limiter(info.run_id, config.num_workers, adaptive=config.adaptive_concurrency)
            if config.task_runner == "threads"
            else None  # each Dask worker process has its own
        )
        progress = RunProgress(config.run_name, total=len(pending), already_finished=done_before)
        progress.meter = _meter(config, budget, limiter, total=len(ids))
        progress.open(line=start_line)
        jobs = iter_jobs(dataset, config.settings_hash(), pending)  # in prompt order, read one at a time
        if budget.capped:
            spend_guard.register(info.run_id, budget)  # checked before each model request of this process
        try:
            failed = image_failed + _run_prompts(config, jobs, ledger, progress, stop, info.run_id, budget)
        finally:
            spend_guard.unregister(info.run_id)
            progress.close()
        ledger.write_checkpoint()
        ledger.close()
        facts = {"ran": progress.done, "failed": len(failed)}
        if stop.requested:
            finish_invocation(
                info, duration_s=round(time.monotonic() - started, 3), stopped=stop.reason, **facts
            )
            finished_now = len(ledger.finished & index_of.keys())
            message = (
                f"stopped ({stop.reason}): {progress.done} prompts finished in this flow run, "
                f"{finished_now} of {len(ids)} in the run; run it again with --resume to continue"
            )
            logger.warning("%s", message)
            return Cancelled(message=message)

        # quote: Prefect would walk every entry of index_of looking for futures, twice per task
        # call (~14 s at 10^6 prompts, bench/ANALYSIS.md)
        merge = merge_task(run_dir, quote(index_of))
        duration = time.monotonic() - started
        finish_invocation(info, duration_s=round(duration, 3), budget_reached=budget.reached, **facts)
        run_control = {
            "budget": budget.figures(),
            "concurrency": {**limiter.snapshot(), "scope": "flow process"} if limiter else None,
        }
        stats = statistics_task(
            config, merge, quote(index_of), info.total_duration, [f["prompt_id"] for f in failed], run_control
        )
        _publish(config, stats, failed, warnings=warnings)
        progress.announce(
            f"run {config.run_name} done in {duration:.1f} s: {stats['completed']} trajectories, "
            f"{stats['discarded_no_reasoning']} discarded, {len(failed)} failed · {meter_text(progress.figures())}"
        )
        if config.pilot:
            report = pilot_run.report(
                config, [ids[i] for i in drawn], run_dir, total_prompts=len(ids), wall_s=duration
            )
            write_json_atomic(run_dir / "pilot.json", {**report, "flow_run_id": str(flow_run.id)})
            create_markdown_artifact(
                markdown=pilot_run.markdown(report), key=artifact_key(config.run_name, "pilot")
            )
            logger.info("%s", pilot_run.summary_line(report))
        if budget.reached:
            message = budget.message(len(ledger.finished & index_of.keys()), len(ids))
            logger.warning("%s", message)
            return Failed(name="BudgetReached", message=message)
        if config.pilot:
            return Completed(message=pilot_run.summary_line(report))

    if failed:
        return Failed(
            message=(
                f"{len(failed)} of {len(ids)} prompts failed (see {run_dir / 'failures.jsonl'}); "
                "every other output is written. A retry of this flow run re-attempts only the failed prompts."
            )
        )
    return Completed(message=f"{stats['completed']} trajectories in {run_dir / 'trajectories.jsonl'}")


_generate_trajectories.__signature__ = options_signature()  # one parameter per option (flows.config)
_generate_trajectories.__doc__ = (_generate_trajectories.__doc__ or "") + options_docstring()
generate_trajectories = flow(name="generate-trajectories", persist_result=False, log_prints=True)(
    _generate_trajectories
)
"""The ``generate-trajectories`` flow. Call it with the flat options: ``generate_trajectories(**config.options())``."""


def result_storage(config: BatchConfig) -> Path | str:
    """Where prompt results (the cache) live: a folder (default ``<run>/.prefect-results``) or ``block:<slug>``.

    A ``block:`` value names a saved Prefect storage block (e.g. ``block:s3-bucket/hermes-cache``) so that
    workers on several machines share one cache.
    """
    value = config.result_storage
    if value and value.startswith("block:"):
        return value.removeprefix("block:")
    return Path(value or config.run_dir / ".prefect-results").resolve()


def prompt_task_runner(config: BatchConfig):
    """The task runner of the prompt tasks: a thread pool of ``num_workers`` threads, or a ``DaskTaskRunner``.

    ``dask`` uses the scheduler at ``dask_address``, or starts a local multi-process cluster of
    ``dask_workers`` processes (threads per process so that ``num_workers`` prompts fit). Dask
    workers reach Prefect through ``PREFECT_API_URL``: use a real server with Dask.
    """
    if config.task_runner != "dask":
        return ThreadPoolTaskRunner(max_workers=config.num_workers)
    from prefect_dask import DaskTaskRunner

    if config.dask_address:
        return DaskTaskRunner(address=config.dask_address)
    threads = max(1, -(-config.num_workers // config.dask_workers))
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": config.dask_workers,
            "threads_per_worker": threads,
            "processes": True,
            "dashboard_address": None,
        }
    )


def _run_prompts(
    config: BatchConfig,
    pending: Iterable[PromptJob],
    ledger: RunLedger,
    progress: RunProgress,
    stop: RunStop,
    run_id: str,
    budget: Budget,
) -> list[dict[str, Any]]:
    """Keep ``num_workers`` prompt tasks running; record each outcome as it arrives.

    No prompt starts once ``budget`` refuses (:meth:`~flows.budget.Budget.allows`).

    Returns:
        The failures of this invocation: ``{prompt_id, prompt_index, error_type, message, attempts}``.

    With the thread pool (and no spend cap), ``num_workers`` more prompts wait in the pool's queue, so a thread that
    finishes a prompt starts the next at once instead of waiting for this thread to record the
    outcome and submit (bench/ANALYSIS.md); the pool's size still bounds the prompts running.
    A Dask cluster may have more threads than ``num_workers``: it gets exactly ``num_workers``.
    """
    if stop.requested:
        return []
    runner = prompt_task_runner(config)
    # no prompts wait in the pool's queue under a spend cap: the cap then decides for each prompt as
    # a slot frees, counting only prompts that run (a queued one refused by the cap would be wasted)
    queued = 0 if config.task_runner == "dask" or budget.capped else config.num_workers
    local_cluster = config.task_runner == "dask" and not config.dask_address
    # prefect-dask creates the local cluster at the first submit, inside this block
    with local_dask_cluster_settings() if local_cluster else contextlib.nullcontext(), runner:
        window = config.num_workers + queued
        return _sliding_window(config, pending, ledger, progress, stop, runner, window, run_id, budget)


STOP_DRAIN_SECONDS = 10.0
"""After a stop, how long the flow waits for running prompts to end (they are cancelled: seconds)."""


def _sliding_window(
    config, pending, ledger, progress, stop, runner, window: int, run_id: str, budget: Budget
) -> list[dict[str, Any]]:
    task = run_prompt_task.with_options(
        retries=config.retries,
        result_storage=result_storage(config),
        retry_condition_fn=retry_condition(retry_timeouts=config.retry_timeouts),
    )
    spec = config.run_spec().model_copy(update={"run_id": run_id})
    done: queue.SimpleQueue = queue.SimpleQueue()
    queued = iter(pending)  # in prompt order, each record read from the dataset when it is submitted
    in_flight = 0
    failed: list[dict[str, Any]] = []
    give_up_at: float | None = None

    # quote: Prefect does not walk the models field by field looking for futures (none are there);
    # that walk was ~5% of the flow process's CPU at W = 1,024 (bench/ANALYSIS.md). Not with Dask:
    # prefect-dask hands the task a quoted parameter as a plain tuple.
    wrap = quote if config.task_runner != "dask" else (lambda value: value)

    def submit_next() -> bool:
        job = None if stop.requested or not budget.allows(in_flight) else next(queued, None)
        if job is None:
            return False
        parameters = {"job": wrap(job), "spec": wrap(spec), "api_key_secret": config.api_key_secret}
        future = runner.submit(task, parameters)
        future.add_done_callback(lambda fut, job=job: done.put((job, fut)))
        return True

    while in_flight < window and submit_next():
        in_flight += 1
    while in_flight:
        stop.poll()
        if stop.requested and give_up_at is None:
            give_up_at = time.monotonic() + STOP_DRAIN_SECONDS
        if give_up_at is not None and time.monotonic() > give_up_at:
            break  # prompts still running are cancelled; none of them writes to the ledger
        try:
            job, future = done.get(timeout=0.5)
        except queue.Empty:
            continue
        in_flight -= 1
        future.wait()  # the final state travels with the future (the API may still say Pending)
        outcome = _record(job, future.state, ledger, progress, failed)
        _forget(runner, future, outcome)
        while in_flight < window and submit_next():  # one, or more after a spend cap's slow start
            in_flight += 1
    return failed


def _record(job: PromptJob, state: State, ledger: RunLedger, progress: RunProgress, failed: list[dict]):
    """Write one prompt's outcome to the ledger; returns the PromptOutcome (None when it failed).

    A failure is appended to ``failed`` and logged as one warning line (console and Prefect). A
    prompt cancelled by a stop is not a failure: it stays pending for the next invocation.
    """
    if state.is_completed():
        outcome: PromptOutcome = state.result()
        kept = not outcome.status.startswith("discarded")  # "completed" in results cached by older versions
        if kept:
            ledger.record_row(job.prompt_id, outcome.row)
        else:
            ledger.record_discard(
                job.prompt_id,
                {
                    "prompt_index": job.prompt_index,
                    "assistant_turns": outcome.assistant_turns,
                    "usage": outcome.usage,
                },
            )
        progress.record("completed" if kept else "discarded", outcome.usage)
        return outcome
    exc = state.result(raise_on_failure=False)
    if isinstance(exc, PromptCancelled) or state.is_cancelled():
        ledger.record_cancelled(job.prompt_id, job.prompt_index, getattr(exc, "usage", None))
        return None
    error_type = (
        getattr(exc, "error_type", None) or type(exc).__name__
        if isinstance(exc, BaseException)
        else state.type.value
    )
    message = str(exc) if isinstance(exc, BaseException) else (state.message or "")
    attempts = getattr(exc, "attempts", None) or 1
    usage = getattr(exc, "usage", None)
    failed.append(
        ledger.record_failure(
            job.prompt_id, job.prompt_index, error_type, message, attempts=attempts, usage=usage
        )
    )
    settle_failed_usage(job.prompt_id)
    get_run_logger().warning(
        "prompt %d failed after %d attempt(s): %s: %s",
        job.prompt_index,
        attempts,
        error_type,
        _short(message),
    )
    progress.record("failed", usage)
    return None


def _meter(config: BatchConfig, budget: Budget, limiter, total: int):
    """The run-wide figures of the live progress: spend so far, projection, cap, request limit (O(1))."""
    from flows.budget import projection

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


def _left_out(merge: dict[str, int]) -> list[str]:
    """Summary rows for what the merge left out besides hallucinated rows (none when nothing was)."""
    labels = {
        "duplicates_dropped": "duplicate rows dropped",
        "orphaned": "rows of records no longer in the dataset",
        "torn_lines": "unreadable lines (a killed writer's torn line)",
    }
    return [f"| {labels[key]} | {count} |" for key, count in merge.items() if count and key in labels]


def _short(message: str, limit: int = 160) -> str:
    """The first line of ``message``, cut to ``limit`` characters."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _forget(runner, future, outcome: PromptOutcome | None) -> None:
    """Drop what Prefect keeps in memory about a prompt task once its outcome is recorded.

    The flow run context maps every task result (and its fields) to the task's state and keeps
    each task's assets, and the thread pool keeps a cancel event per task, for the whole flow
    run: ~3 KB per prompt never used again here (no prompt result feeds another task), which
    made the flow's memory grow with the number of prompts (bench/ANALYSIS.md). Only entries of
    this task run are removed.
    """
    context = FlowRunContext.get()
    if context is not None:
        context.task_run_assets.pop(future.task_run_id, None)
    if context is not None and outcome is not None:
        for obj in (outcome, *(getattr(outcome, name) for name in type(outcome).model_fields)):
            entry = context.run_results.get(id(obj))
            if entry is not None and entry[0].state_details.task_run_id == future.task_run_id:
                del context.run_results[id(obj)]
    events = getattr(runner, "_cancel_events", None)
    if isinstance(events, dict):
        events.pop(future.task_run_id, None)


def _publish(
    config: BatchConfig, stats: dict[str, Any], failed: list[dict[str, Any]], warnings: list[str]
) -> None:
    """Table artifacts of tool statistics and (when prompts failed) of the failed prompts; a markdown summary."""
    rows = [
        {"tool": tool, **values}
        for tool, values in sorted(stats["tool_statistics"].items(), key=lambda kv: (-kv[1]["count"], kv[0]))
    ]
    create_table_artifact(
        table=rows,
        key=artifact_key(config.run_name, "tool-stats"),
        description=f"Tool usage of run {config.run_name}",
    )
    markdown = summary_markdown(config, stats) + "".join(f"\n> **Warning:** {w}\n" for w in warnings)
    create_markdown_artifact(markdown=markdown, key=artifact_key(config.run_name, "summary"))
    if failed:
        create_table_artifact(
            table=[
                {
                    "prompt_index": f["prompt_index"],
                    "error_type": f["error_type"],
                    "message": _short(f["message"]),
                    "attempts": f["attempts"],
                }
                for f in sorted(failed, key=lambda f: f["prompt_index"])
            ],
            key=artifact_key(config.run_name, "failures"),
            description=f"Prompts of {config.run_name} that failed in this flow run: a Retry re-attempts only these",
        )


def summary_markdown(config: BatchConfig, stats: dict[str, Any]) -> str:
    """The run summary as markdown (counts, reasoning coverage, discards, failures, tokens, cost, duration)."""
    reasoning = stats["reasoning_statistics"]
    tokens = stats["tokens"]
    cost = stats.get("cost_usd")
    lines = [
        f"# Run `{config.run_name}`",
        "",
        "| | |",
        "|---|---|",
        f"| model | `{config.model}` |",
        f"| distribution | {config.distribution} |",
        f"| prompts | {stats['total_prompts']} |",
        f"| trajectories written | {stats['completed']} |",
        f"| discarded (no reasoning) | {stats['discarded_no_reasoning']} |",
        f"| filtered (hallucinated tool) | {stats['filtered_hallucinated']} |",
        f"| failed | {stats['failed']} |",
        f"| reasoning coverage | {reasoning['turns_with_reasoning']}/{reasoning['total_assistant_turns']}"
        f" assistant turns ({reasoning['coverage_percent']}%) |",
        f"| tokens | {tokens['prompt']} prompt, {tokens['completion']} completion, {tokens['reasoning']} reasoning |",
        f"| cost | {'n/a' if cost is None else f'${cost:.4f}'} |",
        f"| duration | {stats['duration_seconds']} s |",
        f"| output | `{config.run_dir / 'trajectories.jsonl'}` |",
        *_left_out(stats.get("merge") or {}),
        f"| view it | `hermes-batch view {config.run_dir}` |",
    ]
    return "\n".join(lines) + "\n"
