"""A real Prefect deployment stack for the tests: server (SQLite or PostgreSQL), deployments, process worker.

Used by the session-scoped ``stack`` fixture of ``tests/conftest.py``: one stack per database for
the whole session, whose tests run in one pytest-xdist worker per database
(``xdist_group("prefect-stack-sqlite")``, ``...-postgres``: the two stacks run side by side),
because each start costs 40-60 s (server, ``prefect deploy``, worker). Each test keeps its own
prompts (they carry the stack's port), run names and output folders, so they share it safely.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parent.parent
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def api_call(method: str, url: str, **kwargs) -> httpx.Response:
    """One API call, retried while a SQLite-backed server answers 503 (database busy), as Prefect's client does."""
    for _ in range(30):
        reply = httpx.request(method, url, timeout=30, **kwargs)
        if reply.status_code not in (429, 503):
            return reply
        time.sleep(1)
    return reply


def stop_group(proc: subprocess.Popen, first=signal.SIGINT, grace: float = 15) -> None:
    """Stop a process group: SIGINT (the worker may ignore SIGTERM), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, first)
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


class Postgres:
    """A private PostgreSQL cluster in a temp folder (Debian's packages), as the notes describe."""

    def __init__(self):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            if os.environ.get("CI"):
                raise RuntimeError("PostgreSQL is not installed: .ci/run must install Debian's postgresql")
            pytest.skip("PostgreSQL not installed (apt-get install postgresql)")
        self.bin = Path(bins[-1]).parent
        # outside pytest's 0700 root-owned temp tree, so that the postgres user can reach it
        self.root = Path(tempfile.mkdtemp(prefix="hermes-pg-"))
        self.port = free_port()
        shutil.chown(self.root, "postgres")

    def _as_postgres(self, *args: str) -> None:
        subprocess.run(["su", "postgres", "-c", " ".join(args)], check=True, capture_output=True, timeout=120)

    def start(self) -> str:
        data = self.root / "data"
        self._as_postgres(f"{self.bin}/initdb", "-D", str(data), "-A", "trust", "-U", "postgres")
        opts = f"'-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1'"
        self._as_postgres(
            f"{self.bin}/pg_ctl", "-D", str(data), "-o", opts, "-l", str(self.root / "log"), "-w", "start"
        )
        self._as_postgres(
            f"{self.bin}/createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "prefect"
        )
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/prefect"

    def stop(self) -> None:
        subprocess.run(
            ["su", "postgres", "-c", f"{self.bin}/pg_ctl -D {self.root / 'data'} stop -m fast"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)


class Stack:
    """Server + deployments + worker; ``api`` is the server's API URL."""

    def __init__(self, root: Path, database_url: str | None, plain_deploy: bool):
        self.root = root
        self.plain_deploy = plain_deploy
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}/api"
        self.env = {
            **os.environ,
            "PREFECT_HOME": str(root / "prefect-home"),
            "PREFECT_API_URL": self.api,
            "PREFECT_UI_API_URL": self.api,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "HERMES_MAX_RETRIES": "1",
        }
        if database_url:
            self.env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database_url
        self.procs: list[subprocess.Popen] = []

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")
        proc = subprocess.Popen(
            [shutil.which("prefect"), *args],
            cwd=self.root,  # not the checkout: a worker started as a service would be
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start_server(self) -> None:
        """Start ``prefect server start`` on this stack's port and wait for its health check."""
        server = self._spawn("server", "server", "start", "--host", "127.0.0.1", "--port", str(self.port))
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.api + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (
                self.root / "server.log"
            ).read_text()
            time.sleep(0.5)

    def prefect(self, *args: str, timeout: float = 180) -> str:
        """Run one ``prefect`` command from the checkout against this stack; returns its stdout."""
        proc = subprocess.run(
            [shutil.which("prefect"), *args], cwd=REPO, env=self.env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout

    def start(self) -> Stack:
        self.start_server()
        if self.plain_deploy:  # Prefect's usual commands, from the checkout, nothing else set
            self.prefect("work-pool", "create", "hermes-batch", "--type", "process")
            self.prefect("work-pool", "create", "hermes-batch-docker", "--type", "docker")
            self.prefect("--no-prompt", "deploy", "--all")
        else:
            deploy = subprocess.run(
                [str(REPO / "deployments" / "deploy.sh")], cwd=REPO, env=self.env, capture_output=True,
                text=True, timeout=180,
            )  # fmt: skip
            assert deploy.returncode == 0, deploy.stdout[-2000:] + deploy.stderr[-2000:]
        self._spawn("worker", "worker", "start", "--pool", "hermes-batch")
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_group(proc)

    def run_deployment(self, name: str, params: dict, job_variables: dict | None = None) -> str:
        """``prefect deployment run`` with one ``--param k=v`` per parameter (and one
        ``--job-variable k=v`` per job variable); returns the flow run id."""
        flags = [arg for key, value in params.items() for arg in ("--param", f"{key}={json.dumps(value)}")]
        for key, value in (job_variables or {}).items():
            flags += ["--job-variable", f"{key}={json.dumps(value)}"]
        out = self.prefect("deployment", "run", f"generate-trajectories/{name}", *flags, timeout=120)
        return re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)

    def wait(self, flow_run_id: str, timeout: float = 180) -> dict:
        """Poll the flow run until it is in a terminal state; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = api_call("GET", f"{self.api}/flow_runs/{flow_run_id}").json()
            if run["state"]["type"] in TERMINAL:
                return run
            time.sleep(0.5)
        raise AssertionError(
            f"flow run {flow_run_id} not finished: {run['state']}; see {self.root}/worker.log"
        )

    def cancel_like_the_ui(self, flow_run_id: str) -> None:
        """The request the Prefect UI's Cancel button sends."""
        reply = api_call(
            "POST",
            f"{self.api}/flow_runs/{flow_run_id}/set_state",
            json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
        )
        assert reply.status_code in (200, 201), reply.text

    def retry_like_the_ui(self, flow_run_id: str) -> None:
        """The request the Prefect UI's Retry button sends."""
        reply = api_call(
            "POST",
            f"{self.api}/flow_runs/{flow_run_id}/set_state",
            json={
                "state": {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"},
                "force": False,
            },
        )
        assert reply.status_code in (200, 201) and reply.json()["status"] == "ACCEPT", reply.text
