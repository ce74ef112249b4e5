"""The prompt dispatcher: which task runner, the sliding window, and recording each outcome.

``num_workers`` prompts are in flight at once in a sliding window (a finished prompt makes room
for the next: no batch waits for its slowest prompt). Results come back to the flow's thread,
which is the ledger's only writer. A spend cap (:mod:`flows.budget`) decides before each prompt
starts; a stop (:mod:`flows.stopping`) ends the window within :data:`STOP_DRAIN_SECONDS`. With
``--stop_when_passed`` a sample whose record already has a passing row is skipped when its turn
comes (the flow hands the samples over sample-major, so a record's later samples usually come
after its earlier ones have ended).
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from flows.budget import Admission, Budget
from flows.config import BatchConfig
from flows.prefect_adapter import forget_task_run
from flows.progress import RunProgress
from flows.stopping import RunStop
from flows.tuning import local_dask_cluster_settings
from hermes_core.exceptions import HermesError, PromptCancelled
from hermes_core.runfolder.folder import RunFolder
from hermes_core.runfolder.ledger import RunLedger
from hermes_core.runner import PromptJob, PromptOutcome
from tasks.prompt import retry_condition, run_prompt_task, settle_failed_usage
from tasks.shared_limit import release_spare_slots
from tasks.statistics import first_line

STOP_DRAIN_SECONDS = 10.0
"""After a stop, how long the flow waits for running prompts to end (they are cancelled: seconds)."""


def result_storage(config: BatchConfig) -> Path | str:
    """Where prompt results (the cache) live: a folder (default ``<run>/.prefect-results``) or ``block:<slug>``.

    A ``block:`` value names a saved Prefect storage block (e.g. ``block:s3-bucket/hermes-cache``) so that
    workers on several machines share one cache.
    """
    value = config.result_storage
    if value and value.startswith("block:"):
        return value.removeprefix("block:")
    return Path(value or RunFolder(config.run_dir).results).resolve()


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


def run_prompts(
    config: BatchConfig,
    pending: Iterable[PromptJob],
    ledger: RunLedger,
    progress: RunProgress,
    stop: RunStop,
    run_id: str,
    budget: Budget,
    passed_records: set[int] | None = None,
    request_limit: int | None = None,
) -> list[dict[str, Any]]:
    """Keep ``num_workers`` prompt tasks running; record each outcome as it arrives.

    ``request_limit``: the most model requests in flight of the run's limiter (the prompts'
    ``max_requests_in_flight``), when lower than ``num_workers`` (the slots of a shared
    ``--concurrency_limit``); None: ``num_workers``.

    No prompt starts once ``budget`` says the cap is reached (:meth:`~flows.budget.Budget.admission`,
    then :meth:`~flows.budget.Budget.refuse`).

    ``passed_records`` (``--stop_when_passed``): the prompt_index of each record with a passing
    row, grown as rows pass. A job of such a record is not submitted (:meth:`RunLedger.record_skipped`,
    :meth:`RunProgress.skip`), and no prompt waits in the pool's queue: a submitted prompt starts at
    once, so none is started after its record passed.

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
    queued = (
        0
        if config.task_runner == "dask" or budget.capped or passed_records is not None
        else config.num_workers
    )
    local_cluster = config.task_runner == "dask" and not config.dask_address
    # prefect-dask creates the local cluster at the first submit, inside this block
    try:
        with local_dask_cluster_settings() if local_cluster else contextlib.nullcontext(), runner:
            window = config.num_workers + queued
            return _sliding_window(
                config,
                pending,
                ledger,
                progress,
                stop,
                runner,
                window,
                run_id,
                budget,
                passed_records,
                request_limit,
            )
    finally:
        release_spare_slots()  # --concurrency_limit: the slots the ended prompts kept for the next ones


def _sliding_window(
    config,
    pending,
    ledger,
    progress,
    stop,
    runner,
    window: int,
    run_id: str,
    budget: Budget,
    passed_records: set[int] | None = None,
    request_limit: int | None = None,
) -> list[dict[str, Any]]:
    task = run_prompt_task.with_options(
        retries=config.retries,
        result_storage=result_storage(config),
        retry_condition_fn=retry_condition(retry_timeouts=config.retry_timeouts),
    )
    spec = config.run_spec().model_copy(update={"run_id": run_id})
    if request_limit is not None:
        spec = spec.model_copy(update={"max_requests_in_flight": min(request_limit, config.num_workers)})
    done: queue.SimpleQueue = queue.SimpleQueue()
    queued = iter(pending)  # in prompt order, each record read from the dataset when it is submitted
    in_flight = 0
    failed: list[dict[str, Any]] = []
    give_up_at: float | None = None

    # quote: Prefect does not walk the models field by field looking for futures (none are there);
    # that walk was ~5% of the flow process's CPU at W = 1,024 (bench/ANALYSIS.md). Not with Dask:
    # prefect-dask hands the task a quoted parameter as a plain tuple.
    wrap = quote if config.task_runner != "dask" else (lambda value: value)

    held: list[PromptJob] = []  # the next job, drawn before asking the budget and kept if it says no

    def next_job() -> PromptJob | None:
        job = held.pop() if held else next(queued, None)
        while job is not None and passed_records is not None and job.prompt_index in passed_records:
            ledger.record_skipped(job.prompt_id)  # --stop_when_passed: its record has passed
            progress.skip()
            job = next(queued, None)
        return job

    def submit_next() -> bool:
        if stop.requested:
            return False
        job = next_job()  # first: with no prompt left, the cap holds nothing back (not "reached")
        if job is None:
            return False
        admission = budget.admission(in_flight)
        if admission is Admission.CAP:
            budget.refuse()  # no prompt starts any more: held retries, cancelled ones with on_budget=cancel
        if admission is not Admission.START:
            held.append(job)
            return False
        parameters = {"job": wrap(job), "spec": wrap(spec), "api_key_secret": config.api_key_secret}
        if config.concurrency_limit:  # else the task's defaults: no parameter more per task run
            parameters["concurrency_limit"] = config.concurrency_limit
            parameters["concurrency_lease_seconds"] = config.concurrency_lease_seconds
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
        outcome = record_outcome(job, future.state, ledger, progress, failed)
        if passed_records is not None and outcome is not None and _passed(outcome):
            passed_records.add(job.prompt_index)
        forget_task_run(runner, future, outcome)
        while in_flight < window and submit_next():  # one, or more after a spend cap's slow start
            in_flight += 1
    return failed


def _passed(outcome: PromptOutcome) -> bool:
    """True when the outcome is a kept row whose ``metadata.passed`` is true (a discarded sample never passes)."""
    kept = not outcome.status.startswith("discarded")
    return kept and outcome.row.get("metadata", {}).get("passed") is True


def record_outcome(
    job: PromptJob, state: State, ledger: RunLedger, progress: RunProgress, failed: list[dict]
) -> PromptOutcome | None:
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
        passed = outcome.row.get("metadata", {}).get("passed") if kept else None
        progress.record("completed" if kept else "discarded", outcome.usage, passed=passed)
        return outcome
    exc = state.result(raise_on_failure=False)
    # the prompt task ends every failure with a HermesError (its usage and attempts set); anything
    # else is a state without our exception (e.g. a crash): its type is the state's, nothing known spent
    failure = exc if isinstance(exc, HermesError) else None
    usage = failure.usage.as_dict() if failure is not None and failure.usage is not None else None
    if isinstance(exc, PromptCancelled) or state.is_cancelled():
        ledger.record_cancelled(job.prompt_id, job.prompt_index, usage)
        return None
    if failure is not None:
        error_type = failure.error_type
    else:
        error_type = type(exc).__name__ if isinstance(exc, BaseException) else state.type.value
    message = str(exc) if isinstance(exc, BaseException) else (state.message or "")
    attempts = failure.attempts if failure is not None else 1
    kind = failure.kind if failure is not None else "infra"  # a crash of the task: this machine's
    failed.append(
        ledger.record_failure(
            job.prompt_id, job.prompt_index, error_type, message, attempts=attempts, usage=usage, kind=kind
        )
    )
    settle_failed_usage(job.prompt_id)
    get_run_logger().warning(
        "prompt %d failed after %d attempt(s): %s: %s",
        job.prompt_index,
        attempts,
        error_type,
        first_line(message),
    )
    progress.record("failed", usage)
    return None
