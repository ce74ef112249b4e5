"""Backend ``modal``: one Modal Sandbox per prompt, through the ``modal`` SDK (``pip install modal``; not a dependency).

``start`` looks up (or creates) the app ``settings.modal_app_name``, builds the image with
``modal.Image.from_registry(IMAGE)`` and creates ``modal.Sandbox.create("sleep", "infinity", ...)``
with ``block_network`` (unless ``settings.container_network``), ``cpu`` and ``memory`` (MiB) from
the settings and a lifetime of :data:`SANDBOX_LIFETIME_S`. Commands are
``sandbox.exec("sh", "-c", ..., timeout=N)`` with stderr merged into stdout and the output
bounded like the local backend's; files go through ``exec`` (``cat`` out, ``cat >`` from
stdin). ``close`` calls ``sandbox.terminate()``. The sandbox's environment is its image's plus
only the names listed in ``HERMES_SANDBOX_ENV`` (one ``modal.Secret.from_dict`` passed as
``secrets=``); nothing of this process's environment goes in otherwise.

Not verified against the live Modal service (unreachable here): the tests drive a stand-in
``modal`` module at the SDK boundary. The calls follow Modal's Sandbox guide
(``Sandbox.create``, ``Sandbox.exec(..., timeout=)``, ``ContainerProcess.stdout/stdin/wait/returncode``,
``StreamWriter.write/write_eof/drain``, ``Sandbox.terminate``). Credentials are Modal's own
(``MODAL_TOKEN_ID`` / ``MODAL_TOKEN_SECRET`` or ``~/.modal.toml``).
"""

from __future__ import annotations

import importlib
import logging
import math
import posixpath
import time
from typing import Any

from hermes_core.environments import ContainerSandbox, ExecResult
from hermes_core.environments._scripts import RUN_SH, ScriptedFiles, file_argv
from hermes_core.environments.output import BoundedOutput
from hermes_core.environments.sandbox_env import listed_environment
from hermes_core.exceptions import ConfigError, SandboxError

logger = logging.getLogger(__name__)

SANDBOX_LIFETIME_S = 24 * 3600
"""Upper bound of a sandbox's life on Modal's side, seconds (a crashed run's sandboxes end by then)."""


def _modal() -> Any:
    """The ``modal`` module. Raises ConfigError naming the extra to install when it is missing."""
    try:
        return importlib.import_module("modal")
    except ImportError:
        raise ConfigError(
            "terminal backend modal needs the Modal SDK: pip install modal (then `modal token new`)"
        ) from None


def _terminate(sandbox: Any) -> None:
    """``sandbox.terminate()``; never raises (Modal ends it at its lifetime anyway)."""
    try:
        sandbox.terminate()
    except Exception as exc:  # noqa: BLE001 - teardown never raises
        logger.warning("could not terminate Modal sandbox: %s", exc)


class ModalEnvironment(ScriptedFiles, ContainerSandbox):
    """Per-prompt sandbox in a Modal Sandbox.

    Args:
        cwd: working directory inside the sandbox (created); relative paths are taken under
            ``/workspace``. None: ``/workspace``.
        image: registry image of the sandbox; None: ``settings.terminal_docker_image``.
        settings: limits, network, app name, timeouts and the output bound; default ``HermesSettings()``.
        run_name, run_id, prompt_id: kept for logs.
        **_ignored: options of other backends, accepted and ignored.

    Attributes:
        cwd: absolute working directory inside the sandbox.
    """

    def __init__(self, cwd: str | None = None, image: str | None = None, **kwargs: object):
        super().__init__(cwd, image, **kwargs)
        self._sandbox: Any = None

    def start(self) -> None:
        """Create the sandbox and its working directory. Idempotent.

        Raises:
            ConfigError: the ``modal`` package is not installed.
            SandboxError: Modal refused or failed to create the sandbox, or the environment was closed.
        """
        if self._closed:
            raise SandboxError("environment already closed")
        if self._sandbox is not None:
            return
        modal = _modal()
        s = self.settings
        listed = listed_environment(s)
        extra = {"secrets": [modal.Secret.from_dict(listed)]} if listed else {}
        try:
            app = modal.App.lookup(s.modal_app_name, create_if_missing=True)
            sandbox = modal.Sandbox.create(
                "sleep",
                "infinity",
                app=app,
                image=modal.Image.from_registry(self.image),
                timeout=SANDBOX_LIFETIME_S,
                cpu=s.container_cpus,
                memory=s.container_memory_mb,
                block_network=not s.container_network,
                **extra,
            )
        except Exception as exc:  # noqa: BLE001 - any SDK failure means no sandbox
            raise SandboxError(f"cannot create a Modal sandbox from {self.image!r}: {exc}") from None
        with self._state_lock:
            closed = self._closed
            if not closed:
                self._sandbox = sandbox
        if closed:  # close() ran while Modal created it: it must not outlive us
            _terminate(sandbox)
            raise SandboxError("environment closed while it started")
        code, _, err = self._run(["mkdir", "-p", "--", self.cwd])
        if code != 0:
            self.close()
            raise SandboxError(
                f"cannot create {self.cwd} in the sandbox: {err.decode(errors='replace')[:300]}"
            )

    def close(self, interrupted: bool = False) -> None:
        """Terminate the sandbox. Idempotent; never raises; safe from another thread while :meth:`start` runs."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            _terminate(sandbox)

    def _exec(self, argv: list[str], timeout: float | None = None) -> Any:
        sandbox = self._sandbox
        if sandbox is None or self._closed:
            raise SandboxError("environment is not running (call start() first; close() ends it)")
        try:
            return sandbox.exec(*argv, timeout=timeout and max(1, math.ceil(timeout)), text=False)
        except Exception as exc:  # noqa: BLE001 - the SDK's errors are not a stable hierarchy
            raise SandboxError(f"Modal exec failed: {exc}") from None

    def execute(self, command: str, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        """Run ``command`` with bash (else sh) ``-c`` in the sandbox, in ``cwd`` (default the environment's cwd).

        The timeout (seconds, default ``settings.terminal_timeout``, rounded up to whole seconds)
        is Modal's exec timeout; a command that ends unsuccessfully at it has returncode 124 and
        ``timed_out=True``. Output: merged stdout+stderr, bounded as in the local backend.

        Raises:
            SandboxError: not started, closed, or Modal failed.
        """
        workdir = posixpath.join(self.cwd, cwd) if cwd and not cwd.startswith("~") else (cwd or self.cwd)
        limit = timeout if timeout is not None else self.settings.terminal_timeout
        started = time.monotonic()
        process = self._exec(["sh", "-c", RUN_SH, "hermes", workdir, cwd or self.cwd, command], limit)
        output = BoundedOutput(self.settings.terminal_output_max_chars)
        try:
            for chunk in process.stdout:
                output.feed(chunk if isinstance(chunk, bytes) else chunk.encode())
            process.wait()
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"Modal exec stream failed: {exc}") from None
        output.feed(b"", final=True)
        text, truncated = output.result()
        code = process.returncode
        if code != 0 and time.monotonic() - started >= limit - 0.5:
            return ExecResult(returncode=124, output=text, truncated=truncated, timed_out=True)
        return ExecResult(returncode=-1 if code is None else code, output=text, truncated=truncated)

    def _file_script(self, script: str, path: str, data: bytes | None = None) -> tuple[int, bytes, bytes]:
        """A file script (:class:`~hermes_core.environments._scripts.ScriptedFiles`) in the sandbox."""
        return self._run(file_argv(script, self.cwd, path), data)

    def _run(self, argv: list[str], data: bytes | None = None) -> tuple[int, bytes, bytes]:
        """Run ``argv`` to the end; (exit code, stdout, stderr). ``data`` goes to stdin."""
        process = self._exec(argv, self.settings.terminal_timeout)
        try:
            if data is not None:
                process.stdin.write(data)
                process.stdin.write_eof()
                process.stdin.drain()
            out, err = process.stdout.read(), process.stderr.read()
            process.wait()
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"Modal exec stream failed: {exc}") from None
        as_bytes = lambda v: v if isinstance(v, bytes) else (v or "").encode()  # noqa: E731
        return (-1 if process.returncode is None else process.returncode), as_bytes(out), as_bytes(err)


__all__ = ["SANDBOX_LIFETIME_S", "ModalEnvironment"]
