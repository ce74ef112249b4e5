"""Every use of a Prefect internal, in one place: what it relies on and why.

Prefect's public API does not cover four things this project needs. Each function here names
the internal it touches; ``tests/test_prefect_adapter.py`` has a canary per internal that fails,
naming the installed Prefect version, when Prefect changes it. Nothing here falls back silently.

* :func:`forget_task_run`: pruning what a flow run keeps in memory per task run
  (``FlowRunContext.run_results``, ``FlowRunContext.task_run_assets``,
  ``ThreadPoolTaskRunner._cancel_events``), without which the flow's memory grows with the
  number of prompts (bench/ANALYSIS.md).
* :func:`set_parameters`: a flow function's ``__signature__`` set from the options model, so that
  the flow has one typed parameter per option (Prefect builds its parameter schema from the
  signature).
* :func:`drain_log_and_event_workers`: ``APILogWorker.drain_all`` / ``EventsWorker.drain_all``,
  which send queued logs and events before a process that started its own API stops it.
* :mod:`flows.local_api` starts the server app (``prefect.server.api.server:create_app``) the
  way ``SubprocessASGIServer`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import prefect
from prefect.context import FlowRunContext
from prefect.task_runners import ThreadPoolTaskRunner

PREFECT_VERSION = prefect.__version__
"""The installed Prefect version (named by the canary tests when an internal changed)."""


def forget_task_run(runner: Any, future: Any, outcome: Any | None) -> None:
    """Drop what Prefect keeps in memory about a finished task run whose outcome is recorded.

    The flow run context maps every task result (and its fields) to the task's state and keeps
    each task's assets, and the thread pool keeps a cancel event per task, for the whole flow
    run: ~3 KB per prompt never used again here (no prompt result feeds another task). Only the
    entries of this task run are removed.

    Args:
        runner: the task runner that ran it (its ``_cancel_events`` dict is pruned when it has one:
            the thread pool does, a Dask runner does not).
        future: the task run's future (``task_run_id``).
        outcome: the task's result (a pydantic model; it and its fields are unmapped), or None.

    Raises:
        AttributeError: Prefect no longer has an internal this relies on.
    """
    context = FlowRunContext.get()
    if context is not None:
        context.task_run_assets.pop(future.task_run_id, None)
        if outcome is not None:
            for obj in (outcome, *(getattr(outcome, name) for name in type(outcome).model_fields)):
                entry = context.run_results.get(id(obj))
                if entry is not None and entry[0].state_details.task_run_id == future.task_run_id:
                    del context.run_results[id(obj)]
    if isinstance(runner, ThreadPoolTaskRunner):
        runner._cancel_events.pop(future.task_run_id, None)


def set_parameters(function: Callable[..., Any], signature: inspect.Signature, doc: str) -> None:
    """Give ``function`` (taking ``**options``) the parameters of ``signature`` before ``@flow`` wraps it.

    Prefect reads a flow's parameters and their schema from ``inspect.signature``, which honours
    ``__signature__``; the docstring's ``Args:`` become the parameter descriptions.
    """
    function.__signature__ = signature
    function.__doc__ = (function.__doc__ or "") + doc


def drain_log_and_event_workers(timeout: float = 5.0) -> None:
    """Send Prefect's queued logs and events to the API before it stops (else they fail noisily at exit).

    Best effort: the run's outputs are written already, so an error here is ignored.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=timeout)
        except Exception:  # noqa: BLE001 - best effort, see above
            pass
