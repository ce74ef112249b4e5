"""Flow runs on the docker backend: CLI subprocess -> Prefect (real server) -> containers on a real engine.

The mock model's first terminal call runs the prompt's ``[mock:command=...]``, so each
trajectory's tool output shows what the container saw (its image marker and directory).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import conversation_key, jsonl_rows, run_args, tool_outputs
from tests.hermes_core.environments.test_docker_environment import (
    ABSENT,
    BUSYBOX,
    PYTHON,
    labelled,
    require_engine,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    return require_engine()


def _dataset(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _args(dataset: Path, run: str, server, *extra: str, model: str = "mock/scripted") -> list[str]:
    return run_args(dataset, run, server, "--terminal_env=docker", *extra, model=model)


ENV = {"TERMINAL_DOCKER_IMAGE": BUSYBOX, "HERMES_DOCKER_PULL": "false"}


def test_records_choose_image_and_cwd_missing_image_fails_before_any_model_call(cli, mock_server, engine):
    show = "cat /etc/hermes-image && pwd && ls /sys/class/net"
    records = [
        {"prompt": f"[mock:turns=1,command={show}] in busybox", "image": BUSYBOX, "cwd": "/srv/bb"},
        {"prompt": f"[mock:turns=1,command={show}] in debian", "docker_image": PYTHON, "cwd": "/opt/py"},
        {"prompt": f"[mock:turns=1,command={show}] default image"},
        {"prompt": "[mock:turns=1] needs an absent image", "image": ABSENT},
    ]
    dataset = _dataset(cli.cwd / "images.jsonl", records)
    proc = cli(*_args(dataset, "dk-images", mock_server, "--num_workers=3"), env=ENV)
    assert proc.returncode == 1, proc.stderr[-3000:]
    run = cli.cwd / "data" / "dk-images"

    rows = {r["prompt_index"]: r for r in jsonl_rows(run / "trajectories.jsonl")}
    assert sorted(rows) == [0, 1, 2]
    assert tool_outputs(rows[0]) == [f"{BUSYBOX}\n/srv/bb\nlo"]
    assert tool_outputs(rows[1]) == [f"{PYTHON}\n/opt/py\nlo"]
    assert tool_outputs(rows[2]) == [f"{BUSYBOX}\n/workspace\nlo"]

    failures = jsonl_rows(run / "failures.jsonl")
    assert [(f["prompt_index"], f["error_type"], f["attempts"]) for f in failures] == [
        (3, "ImageUnavailable", 0)
    ]
    assert ABSENT in failures[0]["message"] and "pulling is off" in failures[0]["message"]
    by_conversation = mock_server.stats()["by_conversation"]
    assert conversation_key(records[3]["prompt"]) not in by_conversation  # nothing was sent for it
    assert [by_conversation[conversation_key(r["prompt"])] for r in records[:3]] == [2, 2, 2]
    assert labelled(engine, "dk-images") == []  # every container removed


def test_unreachable_engine_refuses_the_run_in_one_line(cli, mock_server):
    dataset = _dataset(cli.cwd / "down.jsonl", [{"prompt": "never sent"}])
    proc = cli(
        *_args(dataset, "dk-down", mock_server), env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Docker engine not reachable at unix:///nonexistent/docker.sock" in errors[0]
    assert conversation_key("never sent") not in mock_server.stats()["by_conversation"]


def test_killed_run_leaves_containers_that_the_next_run_removes(cli, mock_server, engine):
    # The first request of each conversation hangs, so containers are up when the run is killed.
    prompts = [f"[mock:turns=1,hang_s=120,hang_count=1] kill in container {i}" for i in range(3)]
    dataset = _dataset(cli.cwd / "kill.jsonl", [{"prompt": p} for p in prompts])
    args = _args(dataset, "dk-killed", mock_server, "--num_workers=3")
    proc = cli.spawn(*args, env=ENV)
    deadline = time.monotonic() + 120
    seen = mock_server.stats()["by_conversation"]
    while time.monotonic() < deadline and proc.poll() is None:
        seen = mock_server.stats()["by_conversation"]
        if len(labelled(engine, "dk-killed")) == 3 and all(conversation_key(p) in seen for p in prompts):
            break  # every prompt has its container and its first (hanging) request
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    left = {c.id for c in labelled(engine, "dk-killed")}
    assert len(left) == 3  # SIGKILL: no teardown ran

    resumed = cli(*args, "--resume", env=ENV, timeout=100)  # the hanging requests are not repeated
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        "removed 3 container(s) left by an earlier invocation of this run" in resumed.stdout + resumed.stderr
    )
    assert labelled(engine, "dk-killed") == []
    assert len(jsonl_rows(cli.cwd / "data" / "dk-killed" / "trajectories.jsonl")) == 3


def _wait_for_containers(engine, run: str, prompts: list[str], proc, server) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        seen = server.stats()["by_conversation"]
        if len(labelled(engine, run)) == len(prompts) and all(conversation_key(p) in seen for p in prompts):
            return
        time.sleep(0.2)
    raise AssertionError(f"the containers of {run} never all started")


def test_sigterm_removes_every_container_and_a_twin_run_elsewhere_is_left_alone(
    cli, mock_server, engine, tmp_path
):
    prompts = [f"[mock:turns=1,hang_s=120,hang_count=1] twin container {i}" for i in range(2)]
    dataset = _dataset(cli.cwd / "twin.jsonl", [{"prompt": p} for p in prompts])
    first = cli.spawn(*_args(dataset, "dk-twin", mock_server, "--num_workers=2"), env=ENV)
    _wait_for_containers(engine, "dk-twin", prompts, first, mock_server)
    live = {c.id for c in labelled(engine, "dk-twin")}

    # the same run name in another output folder: its start must not reap the first run's containers
    other = _dataset(cli.cwd / "other.jsonl", [{"prompt": "[mock:turns=1] twin elsewhere"}])
    second = cli(*_args(other, "dk-twin", mock_server, f"--output_dir={tmp_path / 'elsewhere'}"), env=ENV)
    assert second.returncode == 0, second.stderr[-3000:]
    assert {c.id for c in labelled(engine, "dk-twin")} == live

    started = time.monotonic()
    os.kill(first.pid, signal.SIGTERM)
    first.wait(timeout=60)
    assert first.returncode == 130 and time.monotonic() - started < 15
    assert labelled(engine, "dk-twin") == []  # a stopped run leaves no container
