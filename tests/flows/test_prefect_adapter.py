"""Canaries: one per Prefect internal that flows/prefect_adapter.py relies on.

Each checks the exact shape the adapter uses and, when it fails, says which Prefect version is
installed and what changed (then update flows/prefect_adapter.py, not its callers). All but the
last run without a Prefect server.
"""

from __future__ import annotations

import inspect
import logging
import threading
import typing
import uuid
from pathlib import Path
from typing import Annotated, Any

import prefect
import pytest
from pydantic import Field

from flows import prefect_adapter


def changed(what: str) -> str:
    """The assertion message of a canary: the installed Prefect version and what changed."""
    return f"Prefect {prefect.__version__} changed an internal flows/prefect_adapter.py relies on: {what}"


def test_adapter_names_the_installed_version_and_imports_no_prefect():
    import subprocess
    import sys

    assert prefect_adapter.prefect_version() == prefect.__version__
    code = "import sys, flows.prefect_adapter, flows.local_api; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # flows.local_api is used before PREFECT_API_URL is set


def test_flow_run_context_keeps_run_results_and_task_run_assets():
    from prefect.client.schemas.objects import State
    from prefect.context import FlowRunContext

    fields = FlowRunContext.model_fields
    assert "run_results" in fields, changed("FlowRunContext has no run_results field")
    assert "task_run_assets" in fields, changed("FlowRunContext has no task_run_assets field")
    results = fields["run_results"].annotation
    assert typing.get_origin(results) is dict and typing.get_args(results)[0] is int, changed(
        f"FlowRunContext.run_results is {results}, not dict[int, tuple[State, ...]] keyed by id()"
    )
    entry = typing.get_args(results)[1]
    assert typing.get_origin(entry) is tuple and typing.get_args(entry)[0] is State, changed(
        f"a FlowRunContext.run_results entry is {entry}, not a tuple whose first item is the State"
    )
    assets = fields["task_run_assets"].annotation
    assert typing.get_origin(assets) is dict and typing.get_args(assets)[0] is uuid.UUID, changed(
        f"FlowRunContext.task_run_assets is {assets}, not a dict keyed by task run id"
    )


def test_thread_pool_task_runner_has_a_dict_of_cancel_events():
    from prefect.task_runners import ThreadPoolTaskRunner

    runner = ThreadPoolTaskRunner(max_workers=1)
    assert isinstance(getattr(runner, "_cancel_events", None), dict), changed(
        "ThreadPoolTaskRunner instances have no dict _cancel_events"
    )


def test_a_flow_takes_its_parameters_and_schema_from_the_signature_set():
    from prefect import flow

    def options(**kwargs: Any) -> dict:
        """Probe."""
        return kwargs

    signature = inspect.Signature(
        [
            inspect.Parameter(
                "workers",
                inspect.Parameter.KEYWORD_ONLY,
                default=4,
                annotation=Annotated[int, Field(description="ignored: the docstring's wins", ge=1)],
            ),
            inspect.Parameter("mode", inspect.Parameter.KEYWORD_ONLY, default="fast", annotation=str),
        ],
        return_annotation=Any,
    )
    prefect_adapter.set_parameters(
        options, signature, "\n\nArgs:\n    workers: How many.\n    mode: Which.\n"
    )
    probe = flow(name="adapter-probe")(options)
    assert list(inspect.signature(probe.fn).parameters) == ["workers", "mode"], changed(
        "inspect.signature of a flow function does not honour __signature__"
    )
    schema = probe.parameters.model_dump()
    properties = schema["properties"]
    assert set(properties) == {"workers", "mode"}, changed(
        f"the flow's parameter schema is not built from __signature__: {properties}"
    )
    assert properties["workers"]["default"] == 4 and properties["workers"].get("minimum") == 1, changed(
        f"the parameter schema lost the annotation's default or bounds: {properties['workers']}"
    )
    assert properties["workers"].get("description") == "How many.", changed(
        f"parameter descriptions are no longer read from the docstring's Args: {properties['workers']}"
    )
    assert probe.validate_parameters({"workers": "3"}) == {"workers": 3, "mode": "fast"}, changed(
        "flow parameters are no longer validated against the signature's annotations"
    )


def test_the_generate_flow_has_one_parameter_per_option():
    from flows.config import run_options
    from flows.generate import generate_trajectories

    properties = generate_trajectories.parameters.model_dump()["properties"]
    assert set(properties) == set(run_options()), changed(
        f"generate-trajectories' parameters differ from the options: {set(properties) ^ set(run_options())}"
    )


def test_the_generate_flow_stores_its_parameters_as_prefect_would_without_importing_fastapi():
    import subprocess
    import sys

    code = """
import json, sys
from prefect.futures import PrefectConcurrentFuture
from flows.config import BatchConfig
from flows.generate import generate_trajectories
options = BatchConfig.from_options(
    dataset_file="d.jsonl", batch_size=2, run_name="r", providers_allowed="a,b", max_turns=4
).options()
odd = {"future": object.__new__(PrefectConcurrentFuture), "opaque": object(), "path": __import__("pathlib").Path("/x")}
ours = generate_trajectories.serialize_parameters({**options, **odd})
imported = "fastapi" in sys.modules
from prefect import Flow
theirs = Flow.serialize_parameters(generate_trajectories, {**options, **odd})
print(json.dumps({"imported": imported, "ours": ours, "theirs": theirs}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = __import__("json").loads(out.stdout)
    assert seen["imported"] is False, "the generate flow's parameters imported FastAPI"
    assert seen["ours"] == seen["theirs"], changed("Flow.serialize_parameters encodes differently now")
    assert seen["ours"]["providers_allowed"] == ["a", "b"] and seen["ours"]["max_turns"] == 4
    assert (seen["ours"]["future"], seen["ours"]["opaque"], seen["ours"]["path"]) == (
        "<PrefectConcurrentFuture>", "<object>", "/x"
    )  # fmt: skip


def test_log_and_event_workers_can_be_drained():
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        drain = getattr(worker, "drain_all", None)
        assert inspect.ismethod(drain) and drain.__self__ is worker, changed(
            f"{worker.__name__}.drain_all is no longer a classmethod"
        )
        assert "timeout" in inspect.signature(drain).parameters, changed(
            f"{worker.__name__}.drain_all takes no timeout"
        )
    prefect_adapter.drain_log_and_event_workers(timeout=1)  # nothing queued: returns at once


def test_flow_heartbeats_can_be_turned_off_in_code():
    from prefect import flow
    from prefect.flow_engine import FlowRunEngine
    from prefect.settings import get_current_settings

    @flow
    def probe() -> None:
        pass

    with prefect_adapter.flow_heartbeats_off():
        assert get_current_settings().flows.heartbeat_frequency is None, changed(
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY set to None does not reach settings.flows.heartbeat_frequency"
        )
        assert FlowRunEngine(flow=probe).heartbeat_seconds is None, changed(
            "the flow engine's heartbeat interval no longer follows settings.flows.heartbeat_frequency"
        )


def test_the_server_app_starts_as_subprocess_asgi_server_starts_it():
    from prefect.server.api import server

    module, name = prefect_adapter.LOCAL_API_APP.split(":")
    factory = getattr(server, name, None)
    assert module == server.__name__ and callable(factory), changed(f"no {prefect_adapter.LOCAL_API_APP}")
    assert {"ephemeral", "final"} <= set(inspect.signature(factory).parameters), changed(
        "create_app takes no ephemeral/final arguments"
    )
    source = inspect.getsource(factory)
    for variable in ("PREFECT__SERVER_EPHEMERAL", "PREFECT__SERVER_FINAL"):
        assert variable in prefect_adapter.local_api_server_environment()
        assert variable in source, changed(f"create_app no longer reads {variable}")
    own = inspect.getsource(server.SubprocessASGIServer)
    for part in ("uvicorn", "--factory", prefect_adapter.LOCAL_API_APP, "--app-dir", "--lifespan"):
        assert part in own, changed(f"SubprocessASGIServer no longer starts the app with {part!r}")
    args = prefect_adapter.local_api_server_args(8000)
    app_dir = Path(args[args.index("--app-dir") + 1])
    assert app_dir == Path(prefect.__file__).parent.parent
    assert args[args.index("--factory") + 1] == prefect_adapter.LOCAL_API_APP


def test_the_task_run_recorder_batch_size_is_set_by_its_variable(monkeypatch):
    from prefect.settings import Settings

    from flows.tuning import PREFECT_SERVER_SETTINGS

    (variable, value), *_ = PREFECT_SERVER_SETTINGS.items()
    monkeypatch.setenv(variable, value)
    recorder = Settings().server.services.task_run_recorder
    assert getattr(recorder, "batch_size", None) == int(value), changed(
        f"{variable} no longer sets server.services.task_run_recorder.batch_size"
    )


@pytest.mark.slow
def test_a_task_run_leaves_what_forget_task_run_prunes_and_names_its_log_lines(prefect_server):
    """A real flow run: the entries of a task run, as forget_task_run finds them, and its log records."""
    from prefect import flow, get_run_logger, task
    from prefect.client.schemas.objects import State
    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.task_runners import ThreadPoolTaskRunner
    from pydantic import BaseModel

    class Outcome(BaseModel):
        row: dict

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    @task(name="adapter-canary", persist_result=False)
    def produce() -> Outcome:
        get_run_logger().warning("canary line")
        return Outcome(row={"k": 1})

    @flow(persist_result=False)
    def probe() -> dict:
        context = FlowRunContext.get()
        with ThreadPoolTaskRunner(max_workers=1) as runner:
            future = runner.submit(produce, {})
            future.wait()
            outcome = future.state.result()
            entry = context.run_results.get(id(outcome))
            seen = {
                "entry": entry,
                "id": future.task_run_id,
                "asset": future.task_run_id in context.task_run_assets,
                "event": runner._cancel_events.get(future.task_run_id),
            }
            prefect_adapter.forget_task_run(runner, future, outcome)
            seen["after"] = (
                id(outcome) in context.run_results,
                future.task_run_id in context.task_run_assets,
                future.task_run_id in runner._cancel_events,
            )
            return seen

    handler = Keep(logging.WARNING)
    logging.getLogger(prefect_adapter.TASK_RUN_LOGGERS).addHandler(handler)
    try:
        with temporary_settings({PREFECT_API_URL: prefect_server}):
            seen = probe()
            prefect_adapter.drain_log_and_event_workers()
    finally:
        logging.getLogger(prefect_adapter.TASK_RUN_LOGGERS).removeHandler(handler)
    entry = seen["entry"]
    assert isinstance(entry, tuple) and isinstance(entry[0], State), changed(
        f"a task's result is not mapped to (State, ...) in FlowRunContext.run_results: {entry!r}"
    )
    assert entry[0].state_details.task_run_id == seen["id"], changed(
        "run_results' State no longer names the task run (state_details.task_run_id)"
    )
    assert seen["asset"], changed("FlowRunContext.task_run_assets has no entry per task run")
    assert isinstance(seen["event"], threading.Event), changed(
        "ThreadPoolTaskRunner._cancel_events holds no threading.Event per submitted task run"
    )
    assert seen["after"] == (False, False, False)
    line = next((r for r in records if r.getMessage() == "canary line"), None)
    assert line is not None, changed(f"a task's run logger is not under {prefect_adapter.TASK_RUN_LOGGERS!r}")
    task_run_name, flow_run_name = prefect_adapter.run_log_names(line)
    assert str(task_run_name).startswith("adapter-canary-") and flow_run_name, changed(
        f"run log records no longer carry task_run_name/flow_run_name: {(task_run_name, flow_run_name)}"
    )
