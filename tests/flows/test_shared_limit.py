"""``--concurrency_limit``: one Prefect global concurrency limit shared by every run (README § Run control).

Real Prefect server (the session's), the command line as subprocesses, real HTTP to a mock model
of this test process that refuses (429) a request arriving while more than 4 are in flight.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.prefect_adapter import concurrency_limit_usage, ensure_concurrency_limit
from hermes_core.mockllm import MockServer
from tests.conftest import run_args

pytestmark = pytest.mark.slow

REPOSSESSOR_PASS_S = (
    15  # the server's pass over expired leases (PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS)
)


def _write(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return path


def _usage(cli, name: str) -> dict:
    with temporary_settings(updates={PREFECT_API_URL: cli.api_url}):
        return concurrency_limit_usage(name)


@pytest.fixture
def server():
    with MockServer() as srv:
        yield srv


def test_two_runs_of_16_workers_share_4_slots_and_the_provider_refuses_nothing(cli, server):
    name = f"provider-{uuid.uuid4().hex[:8]}"
    model = "mock/scripted?max_in_flight=4&latency_ms=300"
    procs = {}

    def run(label: str) -> None:
        dataset = _write(cli.cwd / f"{label}.jsonl", [f"{label} prompt {i}: list files" for i in range(24)])
        procs[label] = cli(
            *run_args(dataset, label, server, "--num_workers=16", model=model),
            f"--concurrency_limit={name}",
            "--concurrency_limit_slots=4",
            timeout=400,
        )

    threads = [threading.Thread(target=run, args=(label,)) for label in ("shared-a", "shared-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for label, proc in procs.items():
        assert proc.returncode == 0, f"{label}: {proc.stderr[-3000:]}"
        rows = (cli.cwd / "data" / label / "trajectories.jsonl").read_text().splitlines()
        assert len(rows) == 24, label
    stats = server.stats()
    assert "429" not in stats["by_status"], stats  # no request refused for being over 4 in flight
    assert stats["by_status"]["200"] == stats["requests"] == 2 * 24 * 3, stats
    assert stats["peak_in_flight"] <= 4, stats
    out = (
        procs["shared-a"].stdout
        + procs["shared-a"].stderr
        + procs["shared-b"].stdout
        + procs["shared-b"].stderr
    )
    # the start line names the limit; one of the two runs created it
    assert out.count(f"16 workers, shared limit {name}: 4 slots") == 2, out[-4000:]
    assert out.count(f"shared limit {name}: 4 slots (created)") == 1, out[-4000:]
    assert _usage(cli, name) == {"limit": 4, "active_slots": 0, "active": True}  # every slot given back


def test_a_missing_limit_without_slots_fails_the_run_before_any_request(cli, server):
    dataset = _write(cli.cwd / "nolimit.jsonl", ["no limit 0"])
    proc = cli(*run_args(dataset, "nolimit", server), "--concurrency_limit=never-created")
    assert proc.returncode == 1, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "prefect gcl create never-created --limit N" in out, out[-3000:]
    assert server.stats()["requests"] == 0


def test_a_killed_run_gives_its_slots_back_within_the_lease(cli, server):
    name = f"killed-{uuid.uuid4().hex[:8]}"
    lease = 60  # the shortest lease Prefect's server accepts
    with temporary_settings(updates={PREFECT_API_URL: cli.api_url}):
        assert ensure_concurrency_limit(name, 3) == (3, True)
        assert ensure_concurrency_limit(name, 7) == (3, False)  # an existing limit is left as it is
    dataset = _write(cli.cwd / "killed.jsonl", [f"killed prompt {i}: list files" for i in range(8)])
    model = "mock/scripted?latency_ms=600000"  # requests that never end while the test runs
    proc = cli.spawn(
        *run_args(dataset, "killed", server, "--num_workers=8", model=model),
        f"--concurrency_limit={name}",
        f"--concurrency_lease_seconds={lease}",
    )
    try:
        deadline = time.monotonic() + 120
        while _usage(cli, name)["active_slots"] < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "the run never held the 3 slots"
            time.sleep(0.5)
        time.sleep(1)
        assert _usage(cli, name)["active_slots"] == 3  # 8 workers, never more than the limit's 3
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed_at = time.monotonic()
    while _usage(cli, name)["active_slots"]:
        waited = time.monotonic() - killed_at
        assert waited < lease + REPOSSESSOR_PASS_S + 10, f"slots still held {waited:.0f} s after the kill"
        time.sleep(1)
    assert _usage(cli, name)["active_slots"] == 0
