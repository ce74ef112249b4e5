"""A process that runs the flow again after a stopped run (a Python session, a test session) runs it whole.

A stop (a signal, a cancelled flow run, ``--on_budget cancel`` or ``drain``) cancels every prompt
of the process, and lasts; the next flow run in the same process starts uncancelled. In-process
against the session's real Prefect server and the mock model over HTTP.
"""

from __future__ import annotations

import pytest

from tests.conftest import conversation_key, jsonl_rows, thread_inside, write_prompts

pytestmark = pytest.mark.slow


def test_a_flow_run_after_a_stopped_one_in_the_same_process_runs_every_prompt(
    prefect_server, mock_server, tmp_path
):
    from prefect.settings import PREFECT_API_URL, PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings

    from flows.config import BatchConfig
    from flows.generate import generate_trajectories
    from hermes_core import cancel

    prompts = [f"after a stop {i}" for i in range(3)]
    config = BatchConfig.from_options(
        dataset_file=str(write_prompts(tmp_path / "after.jsonl", prompts)),
        batch_size=2, run_name="after-stop", model="mock/scripted", base_url=mock_server.base_url,
        distribution="terminal_only", output_dir=str(tmp_path / "data"), retries=0, num_workers=2,
    )  # fmt: skip
    cancel.cancel_running()  # what the earlier run's stop left in this process
    cancel.hold_new_prompts()
    try:
        assert cancel.is_cancelled()
        with temporary_settings(
            {PREFECT_API_URL: prefect_server, PREFECT_RESULTS_LOCAL_STORAGE_PATH: tmp_path / "r"}
        ):
            state = generate_trajectories(**config.options(), return_state=True)
    finally:
        cancel.reset()
    assert state.is_completed(), state.message
    rows = jsonl_rows(tmp_path / "data" / "after-stop" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in rows] == prompts
    assert not (tmp_path / "data" / "after-stop" / "failures.jsonl").exists() or not jsonl_rows(
        tmp_path / "data" / "after-stop" / "failures.jsonl"
    )


def test_a_flow_run_beside_a_stopped_runs_prompt_that_does_not_end_fails_at_its_start(
    prefect_server, mock_server, tmp_path
):
    """Un-cancelling would let the stopped run's prompt go on; cancelling every prompt of the new run
    would be a run nobody stopped: it fails at its start, before its run folder exists, and says why."""
    from prefect.settings import PREFECT_API_URL, PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings

    from flows.config import BatchConfig
    from flows.generate import generate_trajectories
    from hermes_core import cancel

    config = BatchConfig.from_options(
        dataset_file=str(write_prompts(tmp_path / "beside.jsonl", ["beside a stuck prompt"])),
        batch_size=1, run_name="beside-stuck", model="mock/scripted", base_url=mock_server.base_url,
        distribution="terminal_only", output_dir=str(tmp_path / "data"), retries=0, num_workers=1,
    )  # fmt: skip
    try:
        with thread_inside(cancel.prompt_in_flight()):
            cancel.cancel_running()  # its run was stopped; its prompt does not end
            with temporary_settings(
                {PREFECT_API_URL: prefect_server, PREFECT_RESULTS_LOCAL_STORAGE_PATH: tmp_path / "r"}
            ):
                state = generate_trajectories(**config.options(), return_state=True)
            still_cancelled = cancel.is_cancelled()
    finally:
        cleared = cancel.reset()  # the prompt has left: the stop can go
    assert cleared
    assert state.is_failed()
    assert "prompts of a stopped flow run are still running in this process" in state.message
    assert not (tmp_path / "data" / "beside-stuck").exists()
    assert still_cancelled  # the stop stayed while its prompt ran
    assert (
        conversation_key("beside a stuck prompt") not in mock_server.stats()["by_conversation"]
    )  # no request
