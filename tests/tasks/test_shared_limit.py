"""``--concurrency_limit``: one Prefect global concurrency limit shared by every run (README § Run control).

Real Prefect server (the session's), the command line as subprocesses, real HTTP to a mock model
of this test process that refuses (429) a request arriving while more than 4 are in flight.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from uuid import UUID

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.prefect_adapter import concurrency_limit_usage, ensure_concurrency_limit
from hermes_core.mockllm import MockServer
from tests.conftest import run_args, wait_until, write_prompts

pytestmark = pytest.mark.slow

REPOSSESSOR_PASS_S = (
    15  # the server's pass over expired leases (PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS)
)


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
        dataset = write_prompts(
            cli.cwd / f"{label}.jsonl", [f"{label} prompt {i}: list files" for i in range(24)]
        )
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
    dataset = write_prompts(cli.cwd / "nolimit.jsonl", ["no limit 0"])
    proc = cli(*run_args(dataset, "nolimit", server), "--concurrency_limit=never-created")
    assert proc.returncode == 1, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "prefect gcl create never-created --limit N" in out, out[-3000:]
    assert server.stats()["requests"] == 0


@pytest.mark.waits  # ~75 s on the lease and the repossessor: started early (tests/conftest.py)
def test_a_killed_run_gives_its_slots_back_within_the_lease(cli, server):
    name = f"killed-{uuid.uuid4().hex[:8]}"
    lease = 60  # the shortest lease Prefect's server accepts
    with temporary_settings(updates={PREFECT_API_URL: cli.api_url}):
        assert ensure_concurrency_limit(name, 3) == (3, True)
        assert ensure_concurrency_limit(name, 7) == (3, False)  # an existing limit is left as it is
    dataset = write_prompts(cli.cwd / "killed.jsonl", [f"killed prompt {i}: list files" for i in range(8)])
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


# --- handover of a slot to the next prompt of the same process (in this test process, real server) ---


@pytest.fixture
def limit(prefect_server):
    """``make(slots) -> name``: a new global concurrency limit on the session's server, with this
    process's slot client (:mod:`tasks.shared_limit`) talking to that server; spares given back after."""
    from tasks import shared_limit

    shared_limit.close_api_client()
    with temporary_settings(updates={PREFECT_API_URL: prefect_server}):
        shared_limit.open_api_client()  # opened here: a thread of the test would not see these settings

        def make(slots: int) -> str:
            name = f"handover-{uuid.uuid4().hex[:8]}"
            assert ensure_concurrency_limit(name, slots) == (slots, True)
            return name

        try:
            yield make
        finally:
            shared_limit.release_spare_slots()
            shared_limit.close_api_client()


def _active(name: str) -> int:
    return concurrency_limit_usage(name)["active_slots"]


def _calls_since(before: dict[str, int]) -> dict[str, int]:
    from tasks.shared_limit import server_calls

    return {kind: n - before[kind] for kind, n in server_calls().items()}


def test_sequential_holds_within_the_grace_share_one_lease_given_back_after_the_grace(limit, monkeypatch):
    from tasks import shared_limit

    monkeypatch.setattr(shared_limit, "HANDOVER_GRACE_SECONDS", 1.0)
    monkeypatch.setattr(shared_limit, "HANDOVER_MAX_AGE_SECONDS", 60.0)
    name = limit(2)
    before, handed = shared_limit.server_calls(), shared_limit.handovers()
    for _ in range(5):
        with shared_limit.hold_slot(name, lease_seconds=60) as held:
            assert held
            assert _active(name) == 1
    assert _calls_since(before) == {"acquire": 1, "locked": 0, "renew": 0, "release": 0}
    assert shared_limit.handovers() - handed == 4
    assert shared_limit.spare_leases() == 1
    assert _active(name) == 1  # the spare still holds its slot on the server...
    waited = wait_until(lambda: shared_limit.spare_leases() == 0, 5)
    assert waited < 1.0 + 0.5  # ...until the grace is over (the renewal thread releases it)
    # the spare leaves the pool before its release request is answered: wait for the server's count
    wait_until(lambda: _active(name) == 0, 5)
    assert _calls_since(before) == {"acquire": 1, "locked": 0, "renew": 0, "release": 1}
    assert shared_limit.held_leases() == 0


def test_a_lease_older_than_the_max_age_is_given_back_not_handed_over(limit, monkeypatch):
    from tasks import shared_limit

    monkeypatch.setattr(shared_limit, "HANDOVER_GRACE_SECONDS", 30.0)
    monkeypatch.setattr(shared_limit, "HANDOVER_MAX_AGE_SECONDS", 0.5)
    name = limit(1)
    before, handed = shared_limit.server_calls(), shared_limit.handovers()
    with shared_limit.hold_slot(name, lease_seconds=60):
        pass
    assert shared_limit.spare_leases() == 1  # young: kept for the next prompt
    with shared_limit.hold_slot(name, lease_seconds=60):  # takes the spare, and outlives the max age
        time.sleep(0.6)
    assert shared_limit.handovers() - handed == 1
    assert shared_limit.spare_leases() == 0  # old: given back when its prompt ended, not kept 30 s
    assert _calls_since(before) == {"acquire": 1, "locked": 0, "renew": 0, "release": 1}
    assert _active(name) == 0


def test_release_spare_slots_gives_every_spare_back_at_once(limit, monkeypatch):
    from tasks import shared_limit

    monkeypatch.setattr(shared_limit, "HANDOVER_GRACE_SECONDS", 30.0)
    monkeypatch.setattr(shared_limit, "HANDOVER_MAX_AGE_SECONDS", 60.0)
    name = limit(3)
    before = shared_limit.server_calls()
    both = threading.Barrier(2)

    def prompt() -> None:
        with shared_limit.hold_slot(name, lease_seconds=60):
            both.wait(timeout=30)  # two prompts at once: two leases

    threads = [threading.Thread(target=prompt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert shared_limit.spare_leases() == 2
    assert _active(name) == 2
    assert shared_limit.release_spare_slots() == 2
    assert shared_limit.spare_leases() == shared_limit.held_leases() == 0
    assert _active(name) == 0
    assert _calls_since(before) == {"acquire": 2, "locked": 0, "renew": 0, "release": 2}


def test_a_process_reusing_its_slot_lets_another_run_in_within_the_max_age(limit, monkeypatch):
    """One slot, this process holding it prompt after prompt (handed over each time): another run
    waiting on the limit (a client of its own, asking every 50 ms) gets it once the lease is too old."""
    from prefect.client.orchestration import get_client

    from tasks import shared_limit

    monkeypatch.setattr(shared_limit, "HANDOVER_GRACE_SECONDS", 1.0)
    monkeypatch.setattr(shared_limit, "HANDOVER_MAX_AGE_SECONDS", 1.0)
    name = limit(1)
    handed = shared_limit.handovers()
    stop = threading.Event()
    errors: list[BaseException] = []

    def prompts() -> None:
        try:
            while not stop.is_set():
                with shared_limit.hold_slot(name, lease_seconds=60):
                    time.sleep(0.1)
                time.sleep(0.2)  # the next prompt starts within the grace
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    import httpx

    loop = threading.Thread(target=prompts)
    loop.start()
    try:
        wait_until(lambda: _active(name) == 1, 10)
        start = time.monotonic()
        with get_client(sync_client=True) as other:
            while True:
                try:
                    reply = other.increment_concurrency_slots_with_lease(
                        names=[name], slots=1, mode="concurrency", lease_duration=60
                    )
                    break
                except httpx.HTTPStatusError as exc:
                    assert exc.response.status_code == 423
                    assert time.monotonic() - start < 10, "the other run never got the slot"
                    time.sleep(0.05)
            waited = time.monotonic() - start
            assert shared_limit.handovers() - handed >= 1  # the process did reuse its lease meanwhile
            # max age + one prompt + the gap is 1.3 s; the slack is for a loaded machine's server calls.
            # Without the max age the process would hand the slot over to itself for good.
            assert waited < 10  # also the loop's bound above
            other.release_concurrency_slots_with_lease(lease_id=UUID(reply.json()["lease_id"]))
    finally:
        stop.set()
        loop.join(timeout=30)
    assert not errors, errors
    shared_limit.release_spare_slots()
    # a spare past its grace is given back by the renewal thread instead, its request maybe still on its way
    wait_until(lambda: _active(name) == 0, 5)


@pytest.fixture
def cancel():
    """:mod:`hermes_core.cancel`, reset when the test ends: its stop is this test's only."""
    from hermes_core import cancel

    yield cancel
    cancel.reset()


def test_a_stop_ends_a_wait_for_a_slot_at_once_and_gives_the_spares_back(limit, monkeypatch, cancel):
    from hermes_core.exceptions import PromptCancelled
    from tasks import shared_limit

    monkeypatch.setattr(shared_limit, "HANDOVER_GRACE_SECONDS", 30.0)
    monkeypatch.setattr(shared_limit, "HANDOVER_MAX_AGE_SECONDS", 60.0)
    name = limit(1)
    with shared_limit.hold_slot(name, lease_seconds=60):
        pass
    assert shared_limit.spare_leases() == 1 and _active(name) == 1
    outcome: list[object] = []

    def waiting_prompt() -> None:  # another limit's prompt, waiting for a slot of a full limit
        try:
            with shared_limit.hold_slot(full, lease_seconds=60):
                outcome.append("held")
        except PromptCancelled as exc:
            outcome.append(exc)

    full = limit(1)
    with shared_limit.hold_slot(full, lease_seconds=60):
        waiter = threading.Thread(target=waiting_prompt)
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not outcome
        stopped = time.monotonic()
        cancel.cancel_running()
        waiter.join(timeout=5)
        assert time.monotonic() - stopped < 1.0
        assert len(outcome) == 1 and isinstance(outcome[0], PromptCancelled), outcome
    # the stop: the held lease is given back when its prompt ends, the spare within a wait slice
    wait_until(lambda: shared_limit.held_leases() == 0, 2)
    # (the renewal thread's release request may still be on its way)
    wait_until(lambda: _active(name) == 0 and _active(full) == 0, 5)
