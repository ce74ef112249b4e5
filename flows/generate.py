"""The ``generate-trajectories`` flow: read dataset -> prepare sandboxes -> map prompt tasks -> filter and merge -> statistics -> publish.

Reads top to bottom like the job it does; the steps live elsewhere:

* ``read-dataset`` (:mod:`tasks.read_dataset`), ``prepare-sandboxes`` (:mod:`tasks.sandboxes`);
* the prompt tasks ``run-prompt`` (:mod:`tasks.prompt`), kept ``num_workers`` at a time by the
  dispatcher (:mod:`flows.dispatch`), which records each outcome in the run folder's ledger
  (:mod:`hermes_core.runfolder`);
* ``merge-trajectories`` with its filters (:mod:`tasks.merge`), ``compute-statistics`` and
  ``publish-artifacts`` (:mod:`tasks.statistics`), through :func:`flows.report.finish_run`.

A retried flow run (the Prefect UI's Retry) continues the same run: finished prompts are skipped
by the ledger or come from the task cache, failed ones run again. Ctrl-C, SIGTERM and a Cancel in
Prefect stop it the same way (:mod:`flows.stopping`): it records what finished and ends
Cancelled. A spend cap (:mod:`flows.budget`) that would be crossed starts no new prompt; the run
drains (or cancels) what runs, writes every output and ends Failed named ``BudgetReached``.
``--pilot N`` runs N drawn prompts and writes ``pilot.json`` (:mod:`flows.pilot`).
``--stop_when_passed`` hands the samples to the dispatcher sample-major (every record's sample 0,
then every record's sample 1, ...), so that a record's later samples usually start after its
earlier ones have ended, and skips the samples of records that have a passing row.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.states import Cancelled, Completed, Failed, State

from flows import pilot as pilot_run
from flows.budget import BUDGET_REACHED, Budget
from flows.config import BatchConfig, options_docstring, options_signature
from flows.dispatch import run_prompts
from flows.prefect_adapter import ensure_concurrency_limit, flow_with_json_parameters, set_parameters
from flows.progress import RunProgress, meter_text
from flows.report import finish_run, run_meter
from flows.stopping import RunStop
from flows.tuning import limit_malloc_arenas, tune_garbage_collector
from hermes_core import cancel, spend_guard
from hermes_core.compression import load_tokenizer
from hermes_core.endpoints import resolve_backend
from hermes_core.environments import isolation_refusal, isolation_warning, network_warning
from hermes_core.exceptions import FAILURE_KINDS, ConfigError
from hermes_core.limiter import run_limiter
from hermes_core.redaction import redact
from hermes_core.runfolder.early_stop import passed_ids
from hermes_core.runfolder.folder import RunFolder
from hermes_core.runfolder.ledger import RunLedger, RunLock
from hermes_core.runfolder.postprocess import write_json_atomic
from hermes_core.runfolder.run_info import (
    check_run_dir,
    finish_invocation,
    iter_jobs,
    prompt_ids,
    start_invocation,
)
from hermes_core.runner import unavailable_tools
from hermes_core.settings import HermesSettings
from tasks.prompt import settings_of
from tasks.read_dataset import read_dataset_task
from tasks.sandboxes import prepare_sandboxes
from tasks.statistics import artifact_key, publish_task


def _generate_trajectories(**options: Any) -> State:
    """Run every prompt of a JSONL dataset through the Hermes agent and write ShareGPT trajectories.

    One parameter per option (the flags of ``batch_runner.py``; see each parameter's description).
    Ends Completed; Failed (after every output is written) when prompts failed, with a message
    that gives the count and says that a retry re-attempts only those; Cancelled when it was
    stopped (Ctrl-C, SIGTERM, Cancel in Prefect): finished prompts are on disk, the merge and
    statistics are left to the next invocation.
    """
    config = BatchConfig.from_options(**options)
    settings = HermesSettings()  # built once per flow run, handed to the parts that need it
    logger = get_run_logger()
    started = time.monotonic()
    limit_malloc_arenas()  # before the prompt threads start
    tune_garbage_collector()  # the modules are imported by now
    scheduled = flow_run.scheduled_start_time
    config = config.for_date(scheduled.date() if scheduled else datetime.now(UTC).date())
    retried = (flow_run.run_count or 1) > 1  # a retry of this flow run continues the same run
    resume = config.resume or retried
    run_dir = config.run_dir
    if not cancel.reset():  # a stop (budget, cancel, signal) of an earlier flow run in this process is over
        if cancel.is_cancelled():
            raise RuntimeError(
                "prompts of a stopped flow run are still running in this process after 5 s; run this "
                "flow in a new process (the command line does), or once they have ended"
            )
        logger.warning(
            "another flow run in this process reached its spend cap and is finishing its prompts: until "
            "they end, this run starts no retry of a failed prompt (it stays pending for --resume)"
        )
    shared_slots, shared_line = _shared_limit(config, logger)
    with RunStop(flow_run.id) as stop, RunLock(run_dir):
        check_run_dir(
            run_dir, config.defining_settings(), resume=resume, overwrite=config.overwrite and not retried
        )
        dataset = read_dataset_task(config, settings)
        if config.compress_to_tokens:  # a tokenizer that does not load fails the run before any prompt
            load_tokenizer(config.tokenizer)
        backend = resolve_backend(config.terminal_env, settings)
        refusal = isolation_refusal(backend, settings)
        if refusal:  # local commands in a container without bubblewrap: stop before any prompt
            raise ConfigError(refusal)
        if config.api_key_secret:  # a Secret block that does not load fails the run, not each prompt
            try:
                settings_of(config.api_key_secret)
            except Exception as exc:  # noqa: BLE001 - Prefect raises ValueError and HTTP errors alike
                raise ConfigError(
                    f"api_key_secret: the Prefect Secret block {config.api_key_secret!r} cannot be "
                    f"loaded ({type(exc).__name__}: {redact(str(exc))[:300]}); create it in the UI "
                    "(Blocks) or with Secret(value=...).save(name) from prefect.blocks.system, or pass "
                    "api_key_secret=null"
                ) from None
        samples = config.samples_per_prompt
        ids = prompt_ids(dataset, config.settings_hash(), samples)  # by slot; records stay on disk
        info = start_invocation(
            run_dir,
            config.run_name,
            config.defining_settings(),
            config.settings_hash(),
            dataset,
            flow_run.id,
            samples=samples,
        )
        ledger = RunLedger.open(run_dir, config.run_name)
        if ledger.torn_bytes:
            logger.warning("repaired a torn last line (%d bytes) left by a killed run", ledger.torn_bytes)
        finished = ledger.finished
        everyone = range(len(ids))
        drawn = pilot_run.draw(everyone, config.pilot, config.seed) if config.pilot else everyone
        pending = [index for index in drawn if ids[index] not in finished]
        del finished
        index_of = {pid: slot // samples for slot, pid in enumerate(ids)}  # a sample's prompt_index
        # --stop_when_passed: the records whose row passed (ledger), then this invocation's
        passed_records = None
        held = 0
        if config.stop_when_passed and samples > 1:
            passed_records = {index_of[pid] for pid in passed_ids(run_dir) if pid in index_of}
            held = len(pending)
            pending = [slot for slot in pending if slot // samples not in passed_records]
            held -= len(pending)
            pending.sort(key=lambda slot: (slot % samples, slot))  # sample-major
        done_before = len(ids) - len(pending) - held
        ledger.plan([(index, ids[index]) for index in pending], config.batch_size, index_of)
        # docker: reap leftovers, check images
        pending, image_failed = prepare_sandboxes(
            info.run_id, pending, dataset, ids, backend, ledger, settings, samples=samples
        )
        warnings = [
            w for w in (isolation_warning(backend, settings), network_warning(backend, settings)) if w
        ]
        for warning in warnings:
            logger.warning("%s", warning)
        for tool, reason in sorted(unavailable_tools(config.distribution, settings).items()):
            logger.info("tool %s not offered: %s", tool, reason)
        start_line = (
            f"run {config.run_name}: {len(ids)} prompts, {done_before} already finished, "
            + (f"{held} skipped (their record passed), " if held else "")
            + f"{len(pending)} to run with {config.num_workers} workers"
            + (f", {shared_line}" if shared_line else "")
        )
        logger.info("%s", start_line)
        budget = Budget.of(config, ledger.spend)
        # the run-wide limiter stays inside the shared limit's slots (its prompts hold at most that many)
        request_limit = min(config.num_workers, shared_slots) if shared_slots else None
        limiter = (
            run_limiter(
                info.run_id, request_limit or config.num_workers, adaptive=config.adaptive_concurrency
            )
            if config.task_runner == "threads"
            else None  # each Dask worker process has its own
        )
        progress = RunProgress(config.run_name, total=len(pending), already_finished=done_before)
        progress.meter = run_meter(config, budget, limiter, total=len(ids))
        progress.open(line=start_line)
        # in slot order, each record read when its prompt starts
        jobs = iter_jobs(dataset, config.settings_hash(), pending, samples)
        if budget.capped:
            spend_guard.register(info.run_id, budget)  # checked before each model request of this process
        try:
            failed = image_failed + run_prompts(
                config, jobs, ledger, progress, stop, info.run_id, budget, passed_records, request_limit
            )
        finally:
            spend_guard.unregister(info.run_id)
            progress.close()
        ledger.write_checkpoint()
        ledger.close()
        facts = {"ran": progress.done, "failed": len(failed)}
        if passed_records is not None:
            facts["skipped"] = progress.skipped
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

        run_control = {
            "failed_by_kind": {kind: sum(f["kind"] == kind for f in failed) for kind in FAILURE_KINDS},
            "budget": budget.figures(),
            "concurrency": {**limiter.snapshot(), "scope": "flow process"} if limiter else None,
        }
        failed_ids = [f["prompt_id"] for f in failed]
        skipped = None
        if passed_records is not None:  # samples held back now: pending, of a record that passed
            finished = ledger.finished | set(failed_ids)
            skipped = sum(ids[slot] not in finished and slot // samples in passed_records for slot in drawn)
            del finished
        stats = finish_run(
            config,
            info,
            index_of,
            failed_ids,
            started=started,
            facts={**facts, "budget_reached": budget.reached},
            run_control=run_control,
            samples_skipped=skipped,
            limiter=limiter,
            budget=budget,
        )
        duration = time.monotonic() - started
        publish_task(config, stats, failed, warnings)
        progress.announce(
            f"run {config.run_name} done in {duration:.1f} s: {stats['completed']} trajectories, "
            f"{stats['discarded_no_reasoning']} discarded, {len(failed)} failed"
            + (f", {skipped} skipped (their record passed)" if skipped else "")
            + f" · {meter_text(progress.figures())}"
        )
        if config.pilot:
            report = pilot_run.report(
                config, [ids[i] for i in drawn], run_dir, total_prompts=len(ids), wall_s=duration
            )
            write_json_atomic(RunFolder(run_dir).pilot, {**report, "flow_run_id": str(flow_run.id)})
            create_markdown_artifact(
                markdown=pilot_run.markdown(report), key=artifact_key(config.run_name, "pilot")
            )
            logger.info("%s", pilot_run.summary_line(report))
        if budget.reached:
            message = budget.message(len(ledger.finished & index_of.keys()), len(ids))
            logger.warning("%s", message)
            return Failed(name=BUDGET_REACHED, message=message)
        if config.pilot:
            return Completed(message=pilot_run.summary_line(report))

    if failed:
        return Failed(
            message=(
                f"{len(failed)} of {len(ids)} prompts failed (see {RunFolder(run_dir).failures}); "
                f"{stats['completed']} trajectories, the run spent {budget.spent_text()}; "
                "every other output is written. A retry of this flow run re-attempts only the failed prompts."
            )
        )
    return Completed(message=f"{stats['completed']} trajectories in {RunFolder(run_dir).trajectories}")


def _shared_limit(config: BatchConfig, logger) -> tuple[int | None, str]:
    """The slots of ``--concurrency_limit`` (created with ``--concurrency_limit_slots`` when missing).

    Logs one line: the limit, its size, and whether this run created it.

    Returns:
        ``(slots, text)``: ``(None, "")`` without ``--concurrency_limit``; else the limit's size and
        the start line's words for it (``shared limit NAME: N slots``, ``(created)`` when it was).

    Raises:
        ConfigError: the limit does not exist and no ``--concurrency_limit_slots`` was given, or it is inactive.
    """
    name = config.concurrency_limit
    if not name:
        return None, ""
    try:
        slots, created = ensure_concurrency_limit(name, config.concurrency_limit_slots)
    except LookupError as exc:
        raise ConfigError(str(exc)) from None
    if created:
        logger.info(
            "created the global concurrency limit %s with %d slots: every prompt of every run naming it "
            "holds one (lease %g s)",
            name,
            slots,
            config.concurrency_lease_seconds,
        )
    else:
        ignored = config.concurrency_limit_slots not in (None, slots)
        logger.info(
            "global concurrency limit %s: %d slots shared by every run naming it (lease %g s)%s",
            name,
            slots,
            config.concurrency_lease_seconds,
            f"; it exists, so --concurrency_limit_slots {config.concurrency_limit_slots} is ignored "
            f"(change it with `prefect gcl update {name} --limit N`)"
            if ignored
            else "",
        )
    return slots, f"shared limit {name}: {slots} slots" + (" (created)" if created else "")


set_parameters(_generate_trajectories, options_signature(), options_docstring())  # one parameter per option
generate_trajectories = flow_with_json_parameters(
    _generate_trajectories, name="generate-trajectories", persist_result=False, log_prints=True
)
"""The ``generate-trajectories`` flow. Call it with the flat options: ``generate_trajectories(**config.options())``."""
