"""Prefect's local API for one command-line run when no ``PREFECT_API_URL`` is set.

It is the server Prefect itself starts for a run without a server (the "ephemeral" API of
``prefect.server.api.server.SubprocessASGIServer``: the same uvicorn command, app factory and
``PREFECT__SERVER_EPHEMERAL`` setting, SQLite under ``PREFECT_HOME``), started by us for three
reasons Prefect's own start cannot serve (the command and the environment, which rely on Prefect's
internals, come from :func:`flows.prefect_adapter.local_api_server_args` and
:func:`~flows.prefect_adapter.local_api_server_environment`; this module only runs the process):

* it runs in its own session, so the terminal's Ctrl-C reaches only the command line, which
  stops the run cleanly and still reports the flow run's final state to a live API;
* its output goes to ``$PREFECT_HOME/hermes-local-api.log``, not to the user's console
  (its shutdown noise: flush errors, CancelledError tracebacks);
* it gets the process's environment without credential-named variables (it needs no key), and
  it is stopped with SIGTERM and given time to store the run's last task-run events;
* it ends with the command line whatever ends that (SIGHUP from a closed terminal, SIGTERM,
  SIGKILL, a crash): on Linux the server is started through a few lines of Python that set
  ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` and then exec uvicorn (the setting survives the exec), so
  the kernel sends it SIGTERM when the command line dies; it then stops in a few seconds.
  The kernel sends that signal when the *thread* that started the child ends, not the process,
  so the server is always started from :func:`_spawner_thread`, a daemon thread that only waits
  for start requests and lives as long as the process (a thread of a caller, a pool's worker,
  could end first and take the server with it). A parent that died before the ``prctl`` is
  caught by comparing ``getppid()`` with the command line's pid. A watcher thread in the
  server, polling its parent, was the alternative: slower to notice, and code of ours inside
  Prefect's server process.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx

from flows.prefect_adapter import local_api_server_args, local_api_server_environment
from hermes_core.redaction import CREDENTIAL_NAME

STARTUP_TIMEOUT = 120.0
"""Seconds to wait for the API's health check (a fresh database takes 15-25 s on 2 cores)."""
STOP_GRACE = 10.0
"""Seconds the API gets after SIGTERM to store queued events before it is killed."""
PORT_ATTEMPTS = 3
"""Ports tried when the server finds its port taken (see :meth:`LocalAPI.start`)."""


PARENT_DEATH_SIGNAL = signal.SIGTERM
"""What the kernel sends the local API when the command line dies (Linux)."""

_EXEC_WITH_PARENT_DEATH_SIGNAL = f"""
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, {int(PARENT_DEATH_SIGNAL)}, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
    sys.exit("prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):  # the command line died before the prctl
    sys.exit(0)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""
"""Run by ``python -S -c`` with the parent's pid and the real command's arguments (after ``python``)."""

_spawn_requests: queue.SimpleQueue = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawner_thread() -> None:
    """Start the subprocesses asked for on :data:`_spawn_requests`, forever (a daemon thread)."""
    while True:
        args, kwargs, result = _spawn_requests.get()
        try:
            result.set_result(subprocess.Popen(args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result.set_exception(exc)


def _popen_from_lasting_thread(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)`` run on :func:`_spawner_thread` (started on first use)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawner_thread, name="hermes-local-api-spawner", daemon=True)
            _spawner.start()
    result: Future = Future()
    _spawn_requests.put((args, kwargs, result))
    return result.result()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_from(path: Path, offset: int) -> str:
    """The text ``path`` gained after byte ``offset`` (empty if it is gone)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


class LocalAPI:
    """A Prefect API server subprocess on 127.0.0.1 for the lifetime of a ``with`` block.

    Attributes:
        url: ``http://127.0.0.1:PORT/api`` once started.
        log_path: where the server's output goes.

    Raises:
        RuntimeError: (from :meth:`start`) the server did not answer within :data:`STARTUP_TIMEOUT`,
            or ended (on a taken port :data:`PORT_ATTEMPTS` times); the message names the log
            file and gives its last lines.
    """

    def __init__(self) -> None:
        self.url = ""
        self.log_path = _prefect_home() / "hermes-local-api.log"
        self._proc: subprocess.Popen | None = None

    def start(self, port: int | None = None) -> str:
        """Start the server and wait until ``/api/health`` answers; returns the API URL.

        The port is a free one picked just before the server binds it; another process can take
        it in between (the kernel hands the same ephemeral range to outbound connections), so a
        server that exits on ``address already in use`` is started again on a new port, up to
        :data:`PORT_ATTEMPTS` times.

        Args:
            port: the port to try first (default: a free one).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(PORT_ATTEMPTS):
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            if self._start_on(port or _free_port()):
                return self.url
            output = _read_from(self.log_path, offset)
            if "address already in use" not in output.lower():
                break
            port = None
        last = "\n".join(output.strip().splitlines()[-5:])
        raise RuntimeError(
            f"the local Prefect API did not start; see {self.log_path}" + (f":\n{last}" if last else "")
        )

    def _start_on(self, port: int) -> bool:
        """Start the server on ``port``; True once it answers, False (stopped) if it ended or timed out."""
        self.url = f"http://127.0.0.1:{port}/api"
        env = {k: v for k, v in os.environ.items() if not CREDENTIAL_NAME.search(k)}
        env.update(local_api_server_environment())
        env.pop("PREFECT_API_URL", None)
        server = local_api_server_args(port)
        if sys.platform == "linux":
            args = [sys.executable, "-S", "-c", _EXEC_WITH_PARENT_DEATH_SIGNAL, str(os.getpid()), *server]
        else:  # no parent-death signal: the server outlives a killed command line
            args = [sys.executable, *server]
        with open(self.log_path, "ab") as log:
            self._proc = _popen_from_lasting_thread(
                args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    break
                try:
                    if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        except BaseException:  # interrupted (Ctrl-C, a stop signal) while it starts
            self.stop()
            raise
        self.stop()
        return False

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs (None before :meth:`start` and after :meth:`stop`)."""
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        """SIGTERM, wait up to :data:`STOP_GRACE` seconds, then SIGKILL. Idempotent.

        Interrupted while it waits (a second Ctrl-C), it kills the server at once and re-raises.
        """
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            _kill(proc)
        except BaseException:
            _kill(proc)
            raise

    def __enter__(self) -> LocalAPI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


__all__ = ["PARENT_DEATH_SIGNAL", "LocalAPI", "STARTUP_TIMEOUT"]
