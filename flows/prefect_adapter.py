"""Every use of a Prefect internal, in one place: what it relies on and why.

Prefect's public API does not cover a few things this project needs. Each function here names
the internal it touches; ``tests/flows/test_prefect_adapter.py`` has a canary per internal that fails,
naming the installed Prefect version and what changed, when Prefect changes it. Nothing here
falls back silently: an internal that is gone raises.

* :func:`forget_task_run`: pruning what a flow run keeps in memory per task run
  (``FlowRunContext.run_results``, ``FlowRunContext.task_run_assets``,
  ``ThreadPoolTaskRunner._cancel_events``), without which the flow's memory grows with the
  number of prompts (bench/ANALYSIS.md).
* :func:`set_parameters`: a flow function's ``__signature__`` set from the options model, so that
  the flow has one typed parameter per option (Prefect builds its parameter schema from
  ``inspect.signature``, which honours ``__signature__``).
* :func:`flow_with_json_parameters`: a ``Flow`` subclass whose ``serialize_parameters`` (public, but
  its FastAPI import is Prefect's choice) encodes with pydantic, so a run does not import FastAPI.
* :func:`drain_log_and_event_workers`: ``APILogWorker.drain_all`` / ``EventsWorker.drain_all``,
  which send queued logs and events before a process that started its own API stops it.
* :func:`flow_heartbeats_off`: ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` set to None in code (the
  environment cannot say None), which the flow engine reads as "start no heartbeat thread".
* :func:`local_api_server_args` / :func:`local_api_server_environment`: the command and the
  environment that start Prefect's server app (``prefect.server.api.server:create_app`` under
  uvicorn, with the private ``PREFECT__SERVER_EPHEMERAL`` / ``PREFECT__SERVER_FINAL`` variables)
  the way Prefect's own ``SubprocessASGIServer`` does. :mod:`flows.local_api` owns the process
  (start, health check on the documented ``/api/health``, stop) and touches no internal itself.
* :func:`run_log_names`: the names Prefect's run loggers put on their records
  (``task_run_name`` / ``flow_run_name``, loggers under ``prefect.task_runs`` /
  ``prefect.flow_runs``), which the console uses to sort the lines it shows.

* :func:`ensure_concurrency_limit` / :func:`concurrency_limit_usage`: a global concurrency limit
  (``--concurrency_limit``) created when missing and read back, through the client's public
  ``create_global_concurrency_limit`` / ``read_global_concurrency_limit_by_name`` (no internal:
  here so that the flow's Prefect calls stay in one place). The prompt task's slot itself
  (:mod:`tasks.shared_limit`, which may not import ``flows``) uses the public client too.

Everything else in ``flows/`` and ``tasks/`` uses Prefect's public API only: ``flow``/``task``,
``prefect.runtime``, states, artifacts, ``quote``, the task runners, and the client
(``get_client(sync_client=True)``: ``read_flow_run``, ``set_flow_run_state``) that
:mod:`flows.stopping` uses to watch for ``CANCELLING`` and to report a stop.

Importing this module imports no Prefect (each function imports what it needs): the command
line uses :func:`local_api_server_args` before it sets ``PREFECT_API_URL``, and Prefect reads
its settings from the environment once, when it is first imported.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import inspect
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

LOCAL_API_APP = "prefect.server.api.server:create_app"
"""The uvicorn factory of Prefect's API server app (what ``SubprocessASGIServer`` runs)."""

TASK_RUN_LOGGERS = "prefect.task_runs"
"""The name of the logger (and the prefix of its children) of Prefect's task-run loggers."""


def prefect_version() -> str:
    """The installed Prefect version (read from its package metadata: Prefect is not imported)."""
    return importlib.metadata.version("prefect")


def forget_task_run(runner: Any, future: Any, outcome: Any | None) -> None:
    """Drop what Prefect keeps in memory about a finished task run whose outcome is recorded.

    The flow run context maps every task result (and its fields) to the task's state and keeps
    each task's assets, and the thread pool keeps a cancel event per task, for the whole flow
    run: ~3 KB per prompt never used again here (no prompt result feeds another task). Only the
    entries of this task run are removed.

    Args:
        runner: the task runner that ran it (its ``_cancel_events`` dict is pruned when it is a
            ``ThreadPoolTaskRunner``; a Dask runner keeps no such dict).
        future: the task run's future (``task_run_id``).
        outcome: the task's result (a pydantic model; it and its fields are unmapped), or None.

    Raises:
        AttributeError: Prefect no longer has an internal this relies on.
    """
    from prefect.context import FlowRunContext
    from prefect.task_runners import ThreadPoolTaskRunner

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
    ``__signature__``; the docstring's ``Args:`` (``doc`` is appended to it; a Google section,
    after a blank line) become the parameter descriptions, over a description in the annotation.
    """
    function.__signature__ = signature
    function.__doc__ = (function.__doc__ or "") + doc


def flow_with_json_parameters(function: Callable[..., Any], **options: Any) -> Any:
    """``prefect.flow(**options)(function)``, whose flow runs store their parameters without FastAPI.

    Prefect's ``Flow.serialize_parameters`` (called once per flow run, to create it on the API)
    encodes each parameter with FastAPI's ``jsonable_encoder``, and its first call imports FastAPI:
    ~0.2 s of CPU in every command-line run, whose parameters are plain JSON values (strings,
    numbers, booleans, None, lists, dicts). The subclass encodes them with pydantic's
    ``to_jsonable_python`` instead (already imported), with Prefect's own rules kept: a future or a
    state, and a value that cannot be encoded, are stored as the placeholder ``"<TypeName>"``.

    Returns a ``prefect.Flow``; ``options`` are the ``flow`` decorator's (name, persist_result, ...).
    """
    from prefect import Flow, State
    from prefect.futures import PrefectFuture
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    class JsonParametersFlow(Flow):
        def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
            encoded: dict[str, Any] = {}
            for key, value in parameters.items():
                if isinstance(value, (PrefectFuture, State)):
                    encoded[key] = f"<{type(value).__name__}>"
                    continue
                try:
                    encoded[key] = to_jsonable_python(value)
                except (PydanticSerializationError, ValueError, TypeError, RecursionError):
                    encoded[key] = f"<{type(value).__name__}>"
            return encoded

    return JsonParametersFlow(fn=function, **options)


def drain_log_and_event_workers(timeout: float = 5.0) -> None:
    """Send Prefect's queued logs and events to the API before it stops (else they fail noisily at exit).

    Args:
        timeout: seconds each worker gets.

    Raises:
        AttributeError: a worker class has no ``drain_all`` any more. An error while draining is
            ignored (best effort: the run's outputs are written already).
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    drains = [worker.drain_all for worker in (APILogWorker, EventsWorker)]  # raises when gone
    for drain in drains:
        try:
            drain(timeout=timeout)
        except Exception:  # noqa: BLE001 - best effort, see above
            pass


@contextlib.contextmanager
def flow_heartbeats_off() -> Iterator[None]:
    """Flow runs started inside this block send no flow-run heartbeats.

    Sets Prefect's ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` to None with ``temporary_settings``; the
    flow engine reads ``flows.heartbeat_frequency`` when a run starts and starts no heartbeat
    thread for None. The environment variable cannot say None (it must be >= 30).

    Raises:
        ImportError: Prefect no longer has that setting.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def local_api_server_args(port: int) -> list[str]:
    """The arguments after ``python`` that serve Prefect's API app on ``127.0.0.1:port``.

    Those of ``SubprocessASGIServer``: uvicorn with the factory :data:`LOCAL_API_APP`, the folder
    that holds the ``prefect`` package as its app dir, errors only, lifespan on.

    Raises:
        ModuleNotFoundError: Prefect's server module is gone (checked on disk: importing it, or any
            Prefect module, here would fix Prefect's settings before ``PREFECT_API_URL`` is set).
    """
    package = importlib.util.find_spec("prefect")  # a top-level package is found, not imported
    if package is None or package.origin is None:
        raise ModuleNotFoundError("no prefect package", name="prefect")
    module = LOCAL_API_APP.split(":", 1)[0]
    app_dir = Path(package.origin).parent.parent
    if not (app_dir / (module.replace(".", "/") + ".py")).is_file():
        raise ModuleNotFoundError(f"no {module} in Prefect {prefect_version()}", name=module)
    return [
        "-m", "uvicorn",
        "--app-dir", str(app_dir),
        "--factory", LOCAL_API_APP,
        "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "error", "--lifespan", "on",
    ]  # fmt: skip


def local_api_server_environment() -> dict[str, str]:
    """Variables to add to the server's environment: no UI, an ephemeral server's app, final.

    ``PREFECT__SERVER_EPHEMERAL`` and ``PREFECT__SERVER_FINAL`` are private: ``create_app`` reads
    them as its ``ephemeral`` / ``final`` arguments (``SubprocessASGIServer`` sets them so).
    """
    return {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}


def run_log_names(record: logging.LogRecord) -> tuple[str | None, str | None]:
    """The task run's and the flow run's names on a log record of Prefect's run loggers.

    Returns:
        ``(task_run_name, flow_run_name)``: each None when the record has none (a record of
        another logger, or of a flow run's logger for the task run's name).
    """
    return record.__dict__.get("task_run_name"), record.__dict__.get("flow_run_name")


def ensure_concurrency_limit(name: str, slots: int | None) -> tuple[int, bool]:
    """The global concurrency limit ``name``: created with ``slots`` slots when it does not exist.

    An existing limit is left as it is (other runs share it), whatever ``slots`` says.

    Args:
        name: the limit's name.
        slots: its size when it must be created, or None (then it must exist).

    Returns:
        ``(size, created)``: the limit's number of slots, and True when this call created it.

    Raises:
        LookupError: the limit does not exist and ``slots`` is None (the message says how to create it),
            or it is inactive (its slots would not be counted).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        created = False
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            if slots is None:
                raise LookupError(
                    f"no global concurrency limit {name!r} on the Prefect server: create it with "
                    f"`prefect gcl create {name} --limit N`, or pass --concurrency_limit_slots N"
                ) from None
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))
                created = True
            except ObjectAlreadyExists:  # another run created it meanwhile
                pass
            limit = client.read_global_concurrency_limit_by_name(name)
    if not limit.active:
        raise LookupError(
            f"global concurrency limit {name!r} is inactive (its slots are not counted): "
            f"`prefect gcl enable {name}`"
        )
    return limit.limit, created


def concurrency_limit_usage(name: str) -> dict[str, Any]:
    """``{"limit": slots, "active_slots": taken now, "active": bool}`` of the global concurrency limit ``name``.

    Raises:
        prefect.exceptions.ObjectNotFound: no such limit.
    """
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(name)
    return {"limit": limit.limit, "active_slots": limit.active_slots, "active": limit.active}


__all__ = [
    "LOCAL_API_APP",
    "concurrency_limit_usage",
    "ensure_concurrency_limit",
    "TASK_RUN_LOGGERS",
    "drain_log_and_event_workers",
    "flow_heartbeats_off",
    "forget_task_run",
    "local_api_server_args",
    "local_api_server_environment",
    "prefect_version",
    "run_log_names",
    "set_parameters",
]
