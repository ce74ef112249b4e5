"""The flow in a container: prefect.yaml's ``generate-docker`` on a Docker work pool, for real.

A ``prefect server`` (SQLite), the work pool ``hermes-batch-docker`` (``--type docker``), the
deployment deployed from prefect.yaml with ``prefect deploy``, and a real ``prefect worker start
--type docker`` on the private engine of ``.ci/docker-up.sh``. Each flow run is a container of the
project image (``hermes-test/hermes-batch:ci``, built from this checkout's Dockerfile by
``.ci/images/build.sh``); each prompt's sandbox is a sibling container started through the mounted
Docker socket. The run folders are on a host folder mounted at ``/data``; the mock model server runs
in this test process and the containers reach it (and the Prefect API) on the host's network,
which the worker picks for a loopback API (the engine here has no bridge).

They count only their own containers (by run name and flow run id). They share one stack, and the
engine with the other Docker tests: pytest-xdist runs them in one worker (``DOCKER_ENGINE_FILES``,
tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import docker
import pytest

from hermes_core.environments.docker_engine import LABEL_RUN
from tests.conftest import jsonl_rows, model_requests, tool_outputs, wait_until, write_prompts
from tests.hermes_core.environments.test_docker_environment import BUSYBOX, labelled, require_engine
from tests.prefect_stack import Stack

pytestmark = pytest.mark.slow

PROJECT_IMAGE = "hermes-test/hermes-batch:ci"
FLOW_RUN_LABEL = "io.prefect.flow-run-id"  # prefect-docker's label on each flow run's container


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    return require_engine(PROJECT_IMAGE)


@pytest.fixture(scope="module")
def docker_stack(engine, tmp_path_factory):
    """Server, the Docker work pool, ``generate-docker`` from prefect.yaml, a Docker worker."""
    stack = Stack(tmp_path_factory.mktemp("docker-stack"), None, plain_deploy=True)
    try:
        stack.start_server()
        stack.prefect("work-pool", "create", "hermes-batch-docker", "--type", "docker")
        stack.prefect("--no-prompt", "deploy", "--name", "generate-docker")
        stack._spawn("worker", "worker", "start", "--pool", "hermes-batch-docker", "--type", "docker")
        yield stack
    finally:
        stack.stop()


def _job_variables(data: Path) -> dict:
    """The deployment's job variables with this test's host folder and engine socket."""
    socket = os.environ["DOCKER_HOST"].removeprefix("unix://")
    return {
        "image": PROJECT_IMAGE,
        "volumes": [f"{data}:/data", f"{socket}:/var/run/docker.sock"],
        "env": {"DOCKER_HOST": "unix:///var/run/docker.sock", "TERMINAL_DOCKER_IMAGE": BUSYBOX},
    }


def _config(data: Path, run_name: str, prompts: list[str], mock_server) -> dict:
    return {
        "dataset_file": str(write_prompts(data / f"{run_name}.jsonl", prompts)).replace(str(data), "/data"),
        "batch_size": 2,
        "run_name": run_name,
        "model": "mock/scripted",
        "base_url": mock_server.base_url,
        "distribution": "terminal_only",
        "api_key_secret": None,  # the mock needs no key (the deployment names a Secret block)
        "retries": 0,
    }


def _worker_log(stack: Stack) -> str:
    """The end of the Docker worker's log: what an unexpected state message does not say."""
    return (stack.root / "worker.log").read_text(errors="replace")[-3000:]


def _flow_containers(client: docker.DockerClient, flow_run_id: str) -> list:
    return labelled(client, flow_run_id, label=FLOW_RUN_LABEL)


def test_deployment_run_in_a_container_writes_to_the_host_volume(docker_stack, engine, mock_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    prompts = [f"[mock:command=cat /etc/hermes-image] in a container {i}" for i in range(3)]
    config = _config(data, "contained", prompts, mock_server)
    started = time.monotonic()
    flow_run_id = docker_stack.run_deployment("generate-docker", config, _job_variables(data))
    first_prompt = wait_until(
        lambda: any(model_requests(mock_server, p) for p in prompts), 180, "the first model request", 0.2
    )
    run = docker_stack.wait(flow_run_id, timeout=240)
    assert run["state"]["type"] == "COMPLETED", (run["state"], _worker_log(docker_stack))
    # it ran in a container of the project image, which is gone (auto_remove)
    assert run["infrastructure_pid"] and ":" in run["infrastructure_pid"], run["infrastructure_pid"]
    assert run["job_variables"]["image"] == PROJECT_IMAGE
    wait_until(lambda: not _flow_containers(engine, flow_run_id), 30, "the flow run's container to go", 0.2)
    rows = jsonl_rows(data / "contained" / "trajectories.jsonl")  # on the host's folder
    assert [r["conversations"][1]["value"] for r in rows] == prompts
    # each prompt's commands ran in a sibling container of the sandbox image, none left
    assert all(tool_outputs(r)[0].strip() == BUSYBOX for r in rows)
    assert labelled(engine, "contained", label=LABEL_RUN) == []
    stats = json.loads((data / "contained" / "statistics.json").read_text())
    assert stats["completed"] == 3 and stats["failed"] == 0
    print(f"prefect deployment run -> first model request in the container: {first_prompt:.1f} s")
    print(f"flow run total: {time.monotonic() - started:.1f} s")


def test_failed_prompt_then_ui_retry_reruns_only_it_in_a_new_container(
    docker_stack, engine, mock_server, tmp_path
):
    data = tmp_path / "data"
    data.mkdir()
    gate = tmp_path / "provider-down"  # read by the mock server, on this host
    gate.write_text("down")
    prompts = [f"docker retry prompt {i} ({docker_stack.port})" for i in range(4)]
    prompts[1] = f"[mock:fail_file={gate}] {prompts[1]}"
    config = _config(data, "retried", prompts, mock_server)
    flow_run_id = docker_stack.run_deployment("generate-docker", config, _job_variables(data))
    run = docker_stack.wait(flow_run_id, timeout=240)
    assert run["state"]["type"] == "FAILED", (run["state"], _worker_log(docker_stack))
    failures_file = data / "retried" / "failures.jsonl"
    failures = failures_file.read_text() if failures_file.exists() else "(no failures.jsonl)"
    assert run["state"]["message"].startswith("1 of 4 prompts failed"), (run["state"]["message"], failures)
    before = [model_requests(mock_server, p) for p in prompts]
    assert [before[i] for i in (0, 2, 3)] == [3, 3, 3]
    first_container = run["infrastructure_pid"]
    # The flow reports Failed from inside its container, which exits a moment later: Retry once it is
    # gone, as a user would. (Engine 20.10 here failed, twice, to start the retry's container while the
    # first one of the same flow run was still exiting: "exec: prefect: executable file not found".)
    wait_until(lambda: not _flow_containers(engine, flow_run_id), 30, "the failed run's container to go", 0.2)

    gate.unlink()
    docker_stack.retry_like_the_ui(flow_run_id)
    run = docker_stack.wait(flow_run_id, timeout=240)
    assert run["state"]["type"] == "COMPLETED", (run["state"], _worker_log(docker_stack))
    assert run["run_count"] == 2 and run["infrastructure_pid"] != first_container
    after = [model_requests(mock_server, p) for p in prompts]
    assert [a - b for a, b in zip(after, before, strict=True)] == [0, 3, 0, 0]
    rows = jsonl_rows(data / "retried" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in rows] == prompts
    wait_until(lambda: not _flow_containers(engine, flow_run_id), 30, "the flow run's container to go", 0.2)


def test_cancel_leaves_no_container(docker_stack, engine, mock_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    held = [f"[mock:command=sleep 600] docker cancel held {i} ({docker_stack.port})" for i in range(3)]
    config = {**_config(data, "cancelled", held, mock_server), "num_workers": 3}
    flow_run_id = docker_stack.run_deployment("generate-docker", config, _job_variables(data))
    wait_until(lambda: len(labelled(engine, "cancelled", label=LABEL_RUN)) == 3, 180, "3 sandboxes", 0.2)
    assert len(_flow_containers(engine, flow_run_id)) == 1

    started = time.monotonic()
    docker_stack.cancel_like_the_ui(flow_run_id)
    run = docker_stack.wait(flow_run_id, timeout=90)
    assert run["state"]["type"] == "CANCELLED", run["state"]
    gone = wait_until(
        lambda: (
            not _flow_containers(engine, flow_run_id) and not labelled(engine, "cancelled", label=LABEL_RUN)
        ),
        60,
        "the flow's container and every sandbox to go",
        0.2,
    )
    print(
        f"cancel -> Cancelled and no container left in {time.monotonic() - started:.1f} s ({gone:.1f} s after)"
    )


def test_local_backend_in_the_image_refuses_before_any_prompt_and_names_docker(engine, mock_server):
    """terminal_env=local in a container without bubblewrap (Docker's seccomp profile): never plain
    subprocesses in silence; HERMES_LOCAL_ISOLATION=none is the explicit way to accept them."""
    prompt = f"local in a container ({mock_server.base_url})"
    command = [
        "sh", "-c",
        f"printf '%s\\n' '{json.dumps({'prompt': prompt})}' > /tmp/d.jsonl && python batch_runner.py "
        f"--dataset_file=/tmp/d.jsonl --batch_size=1 --run_name=local --model=mock/scripted --base_url={mock_server.base_url} "
        "--distribution=terminal_only --output_dir=/tmp/out; echo exit=$?; ls /tmp/out/local 2>/dev/null | wc -l",
    ]  # fmt: skip
    refused = engine.containers.run(PROJECT_IMAGE, command, network_mode="host", remove=True, stderr=True)
    text = refused.decode()
    assert "terminal_env=local cannot isolate commands in this docker container" in text, text
    assert "Use terminal_env=docker" in text and "exit=2" in text, text
    assert text.rstrip().endswith("\n0") and model_requests(mock_server, prompt) == 0, text

    accepted = engine.containers.run(
        PROJECT_IMAGE, command, network_mode="host", remove=True, stderr=True,
        environment={"HERMES_LOCAL_ISOLATION": "none"},
    ).decode()  # fmt: skip
    assert "exit=0" in accepted and model_requests(mock_server, prompt) == 3, accepted


def test_deployment_run_with_the_local_backend_fails_before_any_prompt(docker_stack, mock_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    prompts = [f"local backend in the flow container ({docker_stack.port})"]
    config = {**_config(data, "local-refused", prompts, mock_server), "terminal_env": "local"}
    run = docker_stack.wait(
        docker_stack.run_deployment("generate-docker", config, _job_variables(data)), timeout=240
    )
    assert run["state"]["type"] == "FAILED", run["state"]
    assert "cannot isolate commands in this docker container" in run["state"]["message"], run["state"]
    assert model_requests(mock_server, prompts[0]) == 0
    assert not (data / "local-refused" / "batch_0.jsonl").exists()
