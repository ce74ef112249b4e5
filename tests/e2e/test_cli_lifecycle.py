"""The command line's lifetime, end to end: what it starts ends with it, and a run has one invocation.

Real subprocesses of ``batch_runner.py`` with no ``PREFECT_API_URL`` (so each starts Prefect's
local API, :mod:`flows.local_api`), the ``mock/scripted`` model of a mock server of this test
process (its request log counts what each prompt cost), ``--distribution=terminal_only``.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from hermes_core.mockllm import MockServer
from tests.conftest import (
    conversation_key,
    jsonl_rows,
    prefect_home_from,
    process_alive,
    run_args,
    write_prompts,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SLOW_MODEL = "mock/scripted?latency_ms=2000"  # 3 requests a prompt: ~6 s each
API_GONE_WITHIN = 20.0
"""Seconds the local API may take to end after the command line did (it stops in ~2 s)."""


def _rows(run: Path) -> list[dict]:
    """Rows of every batch file of ``run`` (a torn last line, from a kill, is left out)."""
    rows = []
    for batch in sorted(run.glob("batch_*.jsonl")):
        for line in batch.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def _local_env(home: Path) -> dict[str, str]:
    """The environment of a newcomer's shell: no Prefect server, no key; a Prefect home of the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "OPENROUTER_", "OPENAI_"))}
    return {**env, "PREFECT_HOME": str(home), "HERMES_MAX_RETRIES": "1", "COLUMNS": "200"}


def _spawn(cwd: Path, args: list[str], env: dict, log: Path, **popen: object) -> subprocess.Popen:
    """The command line in the background, in a session of its own, output to ``log``."""
    popen.setdefault("stdin", subprocess.DEVNULL)
    with open(log, "wb") as out:
        popen.setdefault("stdout", out)
        popen.setdefault("stderr", subprocess.STDOUT)
        return subprocess.Popen(
            [sys.executable, str(REPO / "batch_runner.py"), *args],
            cwd=cwd,
            env=env,
            start_new_session=True,
            **popen,
        )


def _local_api(proc: subprocess.Popen) -> tuple[int, int] | None:
    """(pid, port) of the local API among the command line's children, or None."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if "prefect.server.api.server:create_app" in cmdline and "uvicorn" in cmdline:
            return child.pid, int(cmdline[cmdline.index("--port") + 1])
    return None


def _api_answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_for(what: str, condition, proc: subprocess.Popen, log: Path, seconds: float = 150.0):
    """Poll ``condition()`` until it returns a true value (returned); fail if ``proc`` ends first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        assert proc.poll() is None, f"the command line ended ({proc.returncode}) before {what}: {_tail(log)}"
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_bytes()[-3000:].decode(errors="replace") if log.exists() else ""


def _gone_within(pid: int, seconds: float) -> float | None:
    """Seconds ``pid`` took to end (polling), or None if it still runs after ``seconds``."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if not process_alive(pid):
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def _using_home(home: Path) -> list[int]:
    """Pids of live processes whose environment names ``home`` as PREFECT_HOME."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PREFECT_HOME") == str(home) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def server(tmp_path):
    """A mock model server of this test, logging every request."""
    log = tmp_path / "requests.jsonl"
    with MockServer(request_log=str(log)) as srv:
        yield srv


def _slow_run(cli_cwd: Path, server: MockServer, name: str, n: int = 6) -> tuple[list[str], list[str]]:
    prompts = [f"{name} lifecycle prompt {i}: list files" for i in range(n)]
    dataset = write_prompts(cli_cwd / f"{name}.jsonl", prompts)
    return prompts, run_args(dataset, name, server, "--num_workers=2", model=SLOW_MODEL)


def _check_resume(
    cli, server: MockServer, args: list[str], run: Path, prompts: list[str], before: list
) -> None:
    """``--resume`` finishes the run: one row per prompt, and no finished prompt sent again."""
    resumed = cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    merged = jsonl_rows(run / "trajectories.jsonl")
    assert len(merged) == len(prompts)
    assert [r["conversations"][1]["value"] for r in merged] == prompts
    by_conversation = server.stats()["by_conversation"]
    finished = [r["conversations"][1]["value"] for r in before]
    assert [by_conversation[conversation_key(p)] for p in finished] == [3] * len(finished)


@pytest.mark.parametrize(
    ("signum", "when"),
    [
        (signal.SIGHUP, "mid-run"),
        (signal.SIGTERM, "mid-run"),
        (signal.SIGKILL, "mid-run"),
        (signal.SIGHUP, "starting"),
    ],
    ids=["SIGHUP", "SIGTERM", "SIGKILL", "SIGHUP-while-the-API-starts"],
)
def test_the_local_api_ends_with_the_command_line(cli, server, migrated_prefect_db, signum, when):
    home = prefect_home_from(migrated_prefect_db, cli.cwd / "local-prefect-home")
    name = f"{signal.Signals(signum).name.lower()}-{when}"
    prompts, args = _slow_run(cli.cwd, server, name)
    run = cli.cwd / "data" / name
    log = cli.cwd / f"{name}.log"
    proc = _spawn(cli.cwd, args, _local_env(home), log)
    try:
        pid, port = _wait_for("the local API process", lambda: _local_api(proc), proc, log)
        if when == "mid-run":
            _wait_for("the local API to answer", lambda: _api_answers(port), proc, log)
            _wait_for("a finished prompt", lambda: _rows(run), proc, log)
        before = _rows(run)
        os.kill(proc.pid, signum)  # the command line's own process, as a closed terminal or `kill` does
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = _gone_within(pid, API_GONE_WITHIN)
    assert took is not None, f"the local API (pid {pid}) outlived the command line: {_tail(log)}"
    print(f"\n{name}: command line ended {code}, local API gone {took:.1f} s later")
    assert _using_home(home) == []  # nothing holds the run's Prefect home
    if signum == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    assert code == 130, _tail(log)
    output = _tail(log)
    assert "Traceback" not in output, output
    if when == "mid-run":
        assert f"stopped ({signal.Signals(signum).name})" in output, output
        assert _rows(run)[: len(before)] == before  # finished rows intact
        assert not (run / "failures.jsonl").exists()  # cancelled prompts are not failures
    else:
        assert "--resume to continue" in output, output
    if signum == signal.SIGHUP:
        _check_resume(cli, server, args, run, prompts, before)


def _read_terminal(master: int, into: bytearray, stop: threading.Event) -> None:
    """Read the terminal's output until ``stop`` (or EOF), so the command line never blocks on it."""
    while not stop.is_set():
        ready, _, _ = select.select([master], [], [], 0.1)
        if not ready:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.extend(chunk)


def test_closing_the_terminal_stops_the_run_and_its_local_api(cli, server, migrated_prefect_db):
    """The command line on a real terminal (a pty it controls); closing the terminal (its master) is the hang-up."""
    home = prefect_home_from(migrated_prefect_db, cli.cwd / "local-prefect-home")
    prompts, args = _slow_run(cli.cwd, server, "hangup")
    run = cli.cwd / "data" / "hangup"
    master, slave = os.openpty()
    # a session leader that opens a terminal without O_NOCTTY makes it its controlling terminal
    attach = (
        "import os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "for i in (0, 1, 2): os.dup2(fd, i)\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
    )
    output, stop = bytearray(), threading.Event()
    reader = threading.Thread(target=_read_terminal, args=(master, output, stop), daemon=True)
    reader.start()
    proc = subprocess.Popen(
        [sys.executable, "-c", attach, os.ttyname(slave), str(REPO / "batch_runner.py"), *args],
        cwd=cli.cwd,
        env=_local_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(slave)
    log = cli.cwd / "hangup.log"  # what the terminal showed, for the failure messages
    try:

        def shown(condition):
            """``condition`` after saving what the terminal showed so far, for the failure messages."""

            def check():
                log.write_bytes(bytes(output))
                return condition()

            return check

        pid, port = _wait_for("the local API process", shown(lambda: _local_api(proc)), proc, log)
        _wait_for("the local API to answer", shown(lambda: _api_answers(port)), proc, log)
        before = _wait_for("a finished prompt", shown(lambda: _rows(run)), proc, log)
        stop.set()
        reader.join()
        os.close(master)  # the terminal window closes: the kernel hangs up the command line's terminal
        code = proc.wait(timeout=60)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    log.write_bytes(bytes(output))
    assert code == 130, _tail(log)
    took = _gone_within(pid, API_GONE_WITHIN)
    assert took is not None, f"the local API (pid {pid}) outlived the command line"
    assert _using_home(home) == []
    assert _flow_run_state(home, run) == (
        "CANCELLED",
        "Cancelled",
    )  # reported to the local API before it stopped
    _check_resume(cli, server, args, run, prompts, before)


def _flow_run_state(home: Path, run: Path) -> tuple[str, str]:
    """(type, name) of the last invocation's flow run state, read from the local API's database."""
    import sqlite3

    flow_run_id = json.loads((run / "run.json").read_text())["invocations"][-1]["flow_run_id"]
    with sqlite3.connect(home / "prefect.db") as db:
        row = db.execute(
            "SELECT state_type, state_name FROM flow_run WHERE id = ?", (flow_run_id,)
        ).fetchone()
    return tuple(row) if row else None


def _lock_holder(run: Path) -> int | None:
    """The pid written in the run folder's lock while a process holds it, else None."""
    path = run / ".lock"
    if not path.exists():
        return None
    with open(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            text = fh.read().strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None


def test_a_second_invocation_on_a_run_in_use_exits_2_and_the_first_goes_on(cli, server, migrated_prefect_db):
    home = prefect_home_from(migrated_prefect_db, cli.cwd / "local-prefect-home")
    prompts = [f"twice lifecycle prompt {i}: list files" for i in range(4)]
    dataset = write_prompts(cli.cwd / "twice.jsonl", prompts)
    args = run_args(dataset, "twice", server, "--num_workers=2", model="mock/scripted?latency_ms=300")
    run = cli.cwd / "data" / "twice"
    log = cli.cwd / "first.log"
    first = _spawn(cli.cwd, args, _local_env(home), log)
    try:
        # the first holds its run folder before its local API is up (10-30 s), not from its flow on
        _wait_for("the first to hold the run folder", lambda: _lock_holder(run) == first.pid, first, log)
        api = _local_api(first)
        assert api is None or not _api_answers(api[1]), "the run folder was taken only once the API was up"
        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, str(REPO / "batch_runner.py"), *args],
            cwd=cli.cwd,
            env=_local_env(home),
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
        assert second.returncode == 2, second.stderr[-3000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, second.stderr
        assert str(Path("data") / "twice") in errors[0] and "in use by another invocation" in errors[0], (
            errors
        )
        assert f"pid {first.pid}" in errors[0], errors
        assert "starting a local Prefect API" not in second.stderr and "Traceback" not in second.stderr
        assert took < 30, took  # refused at once, not after its own local API and flow
        assert first.poll() is None and _lock_holder(run) == first.pid  # the first goes on, unaffected
        code = first.wait(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert code == 0, _tail(log)
    merged = jsonl_rows(run / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in merged] == prompts
    assert [server.stats()["by_conversation"][conversation_key(p)] for p in prompts] == [3] * 4
    assert _lock_holder(run) is None  # released at exit


def test_the_command_lines_lock_is_lent_to_its_own_flow_only(tmp_path):
    from hermes_core.runfolder.ledger import RunInUseError, RunLock

    with RunLock(tmp_path, lend=True):
        with RunLock(tmp_path):  # the flow in the same process: granted
            with pytest.raises(RunInUseError):  # a second one in the same process is not
                with RunLock(tmp_path):
                    pass
        with RunLock(tmp_path):  # returned, lent again
            pass
        code = (
            "import sys; from pathlib import Path; from hermes_core.runfolder.ledger import RunLock, RunInUseError\n"
            f"try:\n    RunLock(Path({str(tmp_path)!r})).__enter__()\nexcept RunInUseError as e:\n"
            "    print(e); sys.exit(3)\n"
        )
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        assert other.returncode == 3 and f"pid {os.getpid()}" in other.stdout  # another process: refused
    with RunLock(tmp_path):  # released with the lender
        with pytest.raises(RunInUseError):
            with RunLock(tmp_path):
                pass


def _prefect_servers(proc: subprocess.Popen) -> list[int]:
    """Pids of every Prefect API server among the command line's children (its own, or Prefect's ephemeral one)."""
    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "prefect.server.api.server" in cmdline or "prefect server start" in cmdline:
            found.append(child.pid)
    return found


def test_with_api_key_the_flow_uses_the_command_lines_local_api(cli, server, migrated_prefect_db):
    """``--api_key`` loads Prefect: it must happen after the local API set PREFECT_API_URL, or
    Prefect would start a second, ephemeral server of its own that the command line does not own."""
    home = prefect_home_from(migrated_prefect_db, cli.cwd / "api-key-prefect-home")
    prompts, args = _slow_run(cli.cwd, server, "api-key", n=2)
    run = cli.cwd / "data" / "api-key"
    log = cli.cwd / "api-key.log"
    # a shared limit on the command's own local API works, and the run says no other run sees it
    shared = ["--concurrency_limit=local-only", "--concurrency_limit_slots=2"]
    proc = _spawn(cli.cwd, [*args, "--api_key=sk-lifecycle-test-0123456789", *shared], _local_env(home), log)
    try:
        _wait_for("a finished prompt", lambda: _rows(run), proc, log)
        # read now: a start that found its port taken was retried on another port, by another process
        pid, _port = _wait_for("the local API process", lambda: _local_api(proc), proc, log)
        assert _prefect_servers(proc) == [pid], _tail(log)
        assert proc.wait(timeout=120) == 0, _tail(log)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(jsonl_rows(run / "trajectories.jsonl")) == len(prompts)
    assert "sk-lifecycle-test-0123456789" not in log.read_text(errors="replace")
    assert (
        "warning: --concurrency_limit local-only is on this command's own local Prefect API: no other run sees it"
        in " ".join(log.read_text(errors="replace").split())
    )
