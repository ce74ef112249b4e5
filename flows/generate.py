"""The ``generate-trajectories`` flow: dataset -> per-prompt tasks -> ledger -> merge -> statistics.

Reads top to bottom like the job it does. ``num_workers`` prompts are in flight
at once in a sliding window (a finished prompt makes room for the next: no
batch waits for its slowest prompt). Results come back to this flow, which is
the ledger's only writer. A retried flow run (the Prefect UI's Retry) continues
the same run: finished prompts are skipped by the ledger or come from the task
cache, failed ones run again.
"""

from __future__ import annotations

import queue
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import BatchConfig
from flows.progress import RunProgress, artifact_key
from flows.tuning import limit_malloc_arenas
from hermes_core.cancel import cancel_running
from hermes_core.runner import PromptJob, PromptOutcome, unavailable_tools
from hermes_core.settings import HermesSettings
from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tasks.dataset import Dataset, read_dataset
from tasks.images import prepare_sandboxes
from tasks.ledger import RunLedger, RunLock
from tasks.postprocess import compute_statistics, merge_trajectories, write_json_atomic
from tasks.prompt import run_prompt_task
from tasks.run_setup import check_run_dir, finish_invocation, jobs_of, start_invocation


@task(name="read-dataset", persist_result=False)
def read_dataset_task(config: BatchConfig) -> Dataset:
    """Read and validate the JSONL dataset (line-numbered errors; ``skip_invalid`` skips them)."""
    dataset = read_dataset(
        config.dataset_file, max_samples=config.max_samples, skip_invalid=config.skip_invalid
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
    config: BatchConfig, merge, total_prompts: int, duration: float, failed: list[str]
) -> dict:
    """Statistics of the whole run, written to statistics.json."""
    stats = compute_statistics(
        config.run_dir,
        merge=merge,
        run_name=config.run_name,
        distribution=config.distribution,
        model=config.model,
        batch_size=config.batch_size,
        total_prompts=total_prompts,
        duration_seconds=duration,
        failed_prompt_ids=failed,
        valid_tools=ALL_POSSIBLE_TOOLS,
    )
    write_json_atomic(config.run_dir / "statistics.json", stats)
    return stats


@flow(
    name="generate-trajectories",
    persist_result=False,
    log_prints=True,
)
def generate_trajectories(config: BatchConfig) -> State:
    """Run every prompt of ``config.dataset_file`` through the agent and write the run folder.

    Ends Completed, or Failed (after every output is written) when prompts failed;
    the message gives the count and says that a retry re-attempts only those.
    """
    logger = get_run_logger()
    started = time.monotonic()
    limit_malloc_arenas()  # before the prompt threads start
    scheduled = flow_run.scheduled_start_time
    config = config.for_date(scheduled.date() if scheduled else datetime.now(UTC).date())
    retried = (flow_run.run_count or 1) > 1  # a retry of this flow run continues the same run
    resume = config.resume or retried
    run_dir = config.run_dir
    with RunLock(run_dir):
        check_run_dir(
            run_dir, config.defining_settings(), resume=resume, overwrite=config.overwrite and not retried
        )
        dataset = read_dataset_task(config)
        jobs = jobs_of(dataset, config.settings_hash())
        info = start_invocation(
            run_dir, config.run_name, config.defining_settings(), config.settings_hash(), dataset, flow_run.id
        )
        ledger = RunLedger.open(run_dir, config.run_name)
        if ledger.torn_bytes:
            logger.warning("repaired a torn last line (%d bytes) left by a killed run", ledger.torn_bytes)
        finished = ledger.finished
        pending = [job for job in jobs if job.prompt_id not in finished]
        index_of = {job.prompt_id: job.prompt_index for job in jobs}
        done_before = len(jobs) - len(pending)
        ledger.plan([(j.prompt_index, j.prompt_id) for j in pending], config.batch_size, index_of)
        backend = config.terminal_env or HermesSettings().terminal_env  # docker: reap leftovers, check images
        pending, image_failed = prepare_sandboxes(config.run_name, pending, backend, ledger)
        for tool, reason in sorted(unavailable_tools(config.distribution, HermesSettings()).items()):
            logger.info("tool %s not offered: %s", tool, reason)
        logger.info(
            "run %s: %d prompts, %d already finished, %d to run with %d workers",
            config.run_name, len(jobs), done_before, len(pending), config.num_workers,
        )  # fmt: skip
        progress = RunProgress(config.run_name, total=len(pending), already_finished=done_before).open()
        failed = image_failed + _run_prompts(config, pending, ledger, progress)
        ledger.write_checkpoint()
        ledger.close()

        merge = merge_task(run_dir, index_of)
        duration = time.monotonic() - started
        finish_invocation(info, duration_s=round(duration, 3), ran=len(pending), failed=len(failed))
        stats = statistics_task(config, merge, len(jobs), info.total_duration, failed)
        _publish(config, stats)

    if failed:
        return Failed(
            message=(
                f"{len(failed)} of {len(jobs)} prompts failed (see {run_dir / 'failures.jsonl'}); "
                "every other output is written. A retry of this flow run re-attempts only the failed prompts."
            )
        )
    return Completed(message=f"{stats['completed']} trajectories in {run_dir / 'trajectories.jsonl'}")


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
    config: BatchConfig, pending: list[PromptJob], ledger: RunLedger, progress: RunProgress
) -> list[str]:
    """Keep ``num_workers`` prompt tasks running; record each outcome as it arrives. Returns failed ids.

    With the thread pool, ``num_workers`` more prompts wait in the pool's queue, so a thread that
    finishes a prompt starts the next at once instead of waiting for this thread to record the
    outcome and submit (bench/ANALYSIS.md); the pool's size still bounds the prompts running.
    A Dask cluster may have more threads than ``num_workers``: it gets exactly ``num_workers``.
    """
    runner = prompt_task_runner(config)
    queued = 0 if config.task_runner == "dask" else config.num_workers
    with runner:
        return _sliding_window(config, pending, ledger, progress, runner, config.num_workers + queued)


def _sliding_window(config, pending, ledger, progress, runner, window: int) -> list[str]:
    task = run_prompt_task.with_options(retries=config.retries, result_storage=result_storage(config))
    spec = config.run_spec()
    done: queue.SimpleQueue = queue.SimpleQueue()
    queued = iter(sorted(pending, key=lambda j: j.prompt_index))
    in_flight = 0
    failed: list[str] = []

    def submit_next() -> bool:
        job = next(queued, None)
        if job is None:
            return False
        parameters = {"job": job, "spec": spec, "api_key_secret": config.api_key_secret}
        future = runner.submit(task, parameters)
        future.add_done_callback(lambda fut, job=job: done.put((job, fut)))
        return True

    while in_flight < window and submit_next():
        in_flight += 1
    while in_flight:
        job, future = _next_done(done)
        in_flight -= 1
        future.wait()  # the final state travels with the future (the API may still say Pending)
        state = future.state
        outcome: PromptOutcome | None = None
        if state.is_completed():
            outcome = state.result()
            if outcome.status == "completed":
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
            progress.record("completed" if outcome.status == "completed" else "discarded")
        else:
            exc = state.result(raise_on_failure=False)
            error_type = type(exc).__name__ if isinstance(exc, BaseException) else state.type.value
            message = str(exc) if isinstance(exc, BaseException) else (state.message or "")
            ledger.record_failure(
                job.prompt_id, job.prompt_index, error_type, message, attempts=config.retries + 1
            )
            failed.append(job.prompt_id)
            progress.record("failed")
        _forget(runner, future, outcome)
        if submit_next():
            in_flight += 1
    return failed


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


def _next_done(done: queue.SimpleQueue):
    """The next finished (job, future); on Ctrl-C every running prompt is cancelled first.

    Waits in short slices so that the interrupt is seen at once; cancelling kills the
    prompts' commands and sandboxes, so the task runner's shutdown does not wait for them.
    """
    while True:
        try:
            return done.get(timeout=0.5)
        except queue.Empty:
            continue
        except KeyboardInterrupt:
            cancel_running()
            raise


def _publish(config: BatchConfig, stats: dict[str, Any]) -> None:
    """Table artifact of tool statistics and a markdown summary."""
    rows = [
        {"tool": tool, **values}
        for tool, values in sorted(stats["tool_statistics"].items(), key=lambda kv: (-kv[1]["count"], kv[0]))
    ]
    create_table_artifact(
        table=rows,
        key=artifact_key(config.run_name, "tool-stats"),
        description=f"Tool usage of run {config.run_name}",
    )
    create_markdown_artifact(
        markdown=summary_markdown(config, stats), key=artifact_key(config.run_name, "summary")
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
        f"| view it | `hermes-batch view {config.run_dir}` |",
    ]
    return "\n".join(lines) + "\n"
