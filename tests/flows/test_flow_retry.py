"""A retried flow run (what the Prefect UI's Retry does) re-executes only the failed prompts.

In-process against the session's real Prefect server: a deployment of the flow
is registered (the server only lets deployed flow runs be retried), a flow run is
created from it and executed in this process as a worker would; the retry is the
UI's API call (AwaitingRetry, force=False) followed by the engine running the
same flow run again.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import conversation_key

pytestmark = pytest.mark.slow


def test_retry_of_a_failed_flow_run_reexecutes_only_failed_prompts(prefect_server, mock_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.settings import PREFECT_API_URL, PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.states import AwaitingRetry

    from flows.config import BatchConfig
    from flows.generate import generate_trajectories

    gate = tmp_path / "fail-while-present"
    gate.write_text("x")
    prompts = [f"retry test prompt {i}" for i in range(6)]
    prompts[1] = f"[mock:fail_file={gate}] retry test prompt 1"
    prompts[4] = f"[mock:fail_file={gate}] retry test prompt 4"
    dataset = tmp_path / "retry.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    config = BatchConfig.from_options(
        dataset_file=str(dataset),
        batch_size=4,
        run_name="retry",
        model="mock/scripted",
        base_url=mock_server.base_url,
        distribution="terminal_only",
        output_dir=str(tmp_path / "data"),
        retries=0,
        num_workers=3,
    )
    requests = lambda: [mock_server.stats()["by_conversation"].get(conversation_key(p), 0) for p in prompts]  # noqa: E731

    with temporary_settings(
        {PREFECT_API_URL: prefect_server, PREFECT_RESULTS_LOCAL_STORAGE_PATH: tmp_path / "r"}
    ):
        deployment_id = generate_trajectories.to_deployment(name="retry-test").apply()
        with get_client(sync_client=True) as client:
            flow_run = client.create_flow_run_from_deployment(deployment_id, parameters=config.options())
        state = run_flow(
            generate_trajectories, flow_run=flow_run, parameters=config.options(), return_type="state"
        )
        assert state.is_failed()
        assert state.message.startswith("2 of 6 prompts failed")
        first = requests()
        assert [first[i] for i in (0, 2, 3, 5)] == [3, 3, 3, 3]
        run_dir = tmp_path / "data" / "retry"
        assert sorted(r["prompt_index"] for r in map(json.loads, open(run_dir / "trajectories.jsonl"))) == [
            0,
            2,
            3,
            5,
        ]
        flow_run_id = json.loads((run_dir / "run.json").read_text())["invocations"][-1]["flow_run_id"]
        assert flow_run_id == str(flow_run.id)

        gate.unlink()  # the provider recovers
        with get_client(sync_client=True) as client:
            # the UI's Retry button: POST /flow_runs/{id}/set_state AwaitingRetry, force=False
            result = client.set_flow_run_state(
                flow_run_id, AwaitingRetry(message="Retry from the UI"), force=False
            )
            assert result.status.value == "ACCEPT"
            flow_run = client.read_flow_run(flow_run_id)
        retried = run_flow(
            generate_trajectories, flow_run=flow_run, parameters=config.options(), return_type="state"
        )
        assert retried.is_completed(), retried.message
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(flow_run_id).run_count == 2

    second = requests()
    # finished prompts were not executed again; the failed ones ran once more, to the end
    assert [second[i] - first[i] for i in range(6)] == [0, 3, 0, 0, 3, 0]
    rows = [json.loads(line) for line in open(run_dir / "trajectories.jsonl")]
    assert [r["prompt_index"] for r in rows] == [0, 1, 2, 3, 4, 5]
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["failed"] == 0 and stats["completed"] == 6
    info = json.loads((run_dir / "run.json").read_text())
    assert [inv["flow_run_id"] for inv in info["invocations"]] == [flow_run_id, flow_run_id]
