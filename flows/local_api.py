"""Prefect's local API for one command-line run when no ``PREFECT_API_URL`` is set.

It is the server Prefect itself starts for a run without a server (the "ephemeral" API of
``prefect.server.api.server.SubprocessASGIServer``: the same uvicorn command, app factory and
``PREFECT__SERVER_EPHEMERAL`` setting, SQLite under ``PREFECT_HOME``), started by us for three
reasons Prefect's own start cannot serve:

* it runs in its own session, so the terminal's Ctrl-C reaches only the command line, which
  stops the run cleanly and still reports the flow run's final state to a live API;
* its output goes to ``$PREFECT_HOME/hermes-local-api.log``, not to the user's console
  (its shutdown noise: flush errors, CancelledError tracebacks);
* it gets the process's environment without credential-named variables (it needs no key), and
  it is stopped with SIGTERM and given time to store the run's last task-run events.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from hermes_core.redaction import CREDENTIAL_NAME

STARTUP_TIMEOUT = 120.0
"""Seconds to wait for the API's health check (a fresh database takes 15-25 s on 2 cores)."""
STOP_GRACE = 10.0
"""Seconds the API gets after SIGTERM to store queued events before it is killed."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


class LocalAPI:
    """A Prefect API server subprocess on 127.0.0.1 for the lifetime of a ``with`` block.

    Attributes:
        url: ``http://127.0.0.1:PORT/api`` once started.
        log_path: where the server's output goes.

    Raises:
        RuntimeError: (from :meth:`start`) the server did not answer within :data:`STARTUP_TIMEOUT`;
            the message names the log file.
    """

    def __init__(self) -> None:
        self.url = ""
        self.log_path = _prefect_home() / "hermes-local-api.log"
        self._proc: subprocess.Popen | None = None

    def start(self) -> str:
        """Start the server and wait until ``/api/health`` answers; returns the API URL."""
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}/api"
        env = {k: v for k, v in os.environ.items() if not CREDENTIAL_NAME.search(k)}
        env.update(PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
        env.pop("PREFECT_API_URL", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    sys.executable, "-m", "uvicorn",
                    "--app-dir", str(Path(importlib.util.find_spec("prefect").origin).parent.parent),
                    "--factory", "prefect.server.api.server:create_app",
                    "--host", "127.0.0.1", "--port", str(port),
                    "--log-level", "error", "--lifespan", "on",
                ],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the local Prefect API did not start; see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM, wait up to :data:`STOP_GRACE` seconds, then SIGKILL. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> LocalAPI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["LocalAPI", "STARTUP_TIMEOUT"]
