"""Backend ``local``: a fresh temporary directory per prompt, isolated by bubblewrap when it can be.

Several prompts run in one process (threads), so nothing here changes process-wide
state: no ``os.chdir``, no environment mutation.

Isolation (``settings.local_isolation``, see :mod:`hermes_core.environments.isolation`): under
bubblewrap (``auto`` with a working ``bwrap``, or ``bwrap``) each prompt gets one long-lived
sandbox (:class:`~hermes_core.environments._bwrap.BwrapSandbox`): read-only system, only the
prompt's folder (its ``HOME`` and working directory) and a private ``/tmp`` writable, its own
pid namespace, no host home folders, run folder, other prompts or Docker socket; network as
``settings.sandbox_network``. Background processes live on between commands; :meth:`close`
kills every process of the prompt. The file methods see the same view. Without bubblewrap
(``none``, or ``auto`` where it cannot run) commands are plain host subprocesses.

Either way a command runs in its own process group (killed as a whole on timeout) and gets
only an allow-listed environment (:func:`~hermes_core.environments.sandbox_env.local_environment`):
no API key or other secret of this process. In plain mode its parent is a small ``sh`` with
that environment, so ``/proc/$PPID/environ`` shows nothing more.

Examples:
    >>> with LocalEnvironment() as env:
    ...     env.execute("echo hi").output
    'hi\\n'
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from hermes_core.environments import ExecResult, SandboxLifecycle
from hermes_core.environments._bwrap import BwrapSandbox
from hermes_core.environments.isolation import uses_bwrap
from hermes_core.environments.output import BoundedOutput
from hermes_core.environments.sandbox_env import local_environment
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings

_CHUNK = 64 * 1024
_QUIET = 0.05
"""After the shell exits, stop reading once the pipe is silent this long (seconds)."""
_DRAIN_MAX = 1.0
"""After the shell exits, stop reading after this long even if a leftover child still writes."""
_KILL_WAIT = 10.0
"""Longest wait for a killed command's exit status, seconds."""


class LocalEnvironment(SandboxLifecycle):
    """Per-prompt sandbox on the host: its own working directory, commands in their own process groups.

    Args:
        cwd: working directory of the prompt (the record's ``cwd``). Created if missing
            and kept at :meth:`close`; under bubblewrap it is bound writable. None: a fresh
            ``hermes-*`` temporary directory, removed at :meth:`close`.
        settings: isolation, network, ``sandbox_env``, timeouts and the output bound;
            default ``HermesSettings()``.
        environment: the exact environment of every command, for trusted host tools only (the
            singularity backend runs ``apptainer`` this way); it also turns isolation off.
            None: the sandbox allow-list.
        **_ignored: backend-neutral options of other backends (``image``, ``run_name``,
            ``run_id``, ``prompt_id`` ...), accepted and ignored.

    Attributes:
        cwd: absolute working directory ("" until :meth:`start`); also the commands' ``HOME``.
        isolated: True once :meth:`start` put the prompt in a bubblewrap sandbox.
    """

    def __init__(
        self,
        cwd: str | None = None,
        settings: HermesSettings | None = None,
        environment: dict[str, str] | None = None,
        **_ignored: object,
    ):
        self.settings = settings or HermesSettings()
        self._requested_cwd = cwd
        self._environment = environment
        self.cwd = ""
        self.isolated = False
        self._tempdir: str | None = None
        self._sandbox_tmp: str | None = None  # host folder seen as /tmp inside the bubblewrap sandbox
        self._sandbox: BwrapSandbox | None = None
        self._env: dict[str, str] = {}
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._shell = shutil.which("bash") or "/bin/sh"

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Create the working directory and, under isolation, the prompt's bubblewrap sandbox. Idempotent.

        Safe against :meth:`close` called from another thread meanwhile: then nothing is left
        running or created, and SandboxError is raised.

        Raises:
            SandboxError: the directory cannot be created, the environment was closed, or
                bubblewrap isolation is required (``HERMES_LOCAL_ISOLATION=bwrap``) and bwrap is
                missing or cannot build a sandbox here.
        """
        if self._closed:
            raise SandboxError("environment already closed")
        if self._started:
            return
        isolate = self._environment is None and uses_bwrap(self.settings)
        bwrap = shutil.which("bwrap") if isolate else None
        if isolate and not bwrap:
            raise SandboxError(
                "HERMES_LOCAL_ISOLATION=bwrap but bwrap is not installed "
                "(apt-get install bubblewrap, or HERMES_LOCAL_ISOLATION=none)"
            )
        try:
            if self._requested_cwd:
                cwd = os.path.realpath(os.path.expanduser(self._requested_cwd))
                os.makedirs(cwd, exist_ok=True)
            else:
                cwd = self._keep("_tempdir", os.path.realpath(tempfile.mkdtemp(prefix="hermes-")))
            self.cwd = cwd
            if isolate:
                tmp = self._keep("_sandbox_tmp", os.path.realpath(tempfile.mkdtemp(prefix="hermes-sbtmp-")))
        except OSError as exc:
            self.close()
            raise SandboxError(f"cannot create working directory: {exc}") from exc
        if self._environment is not None:
            self._env = dict(self._environment)
        else:
            self._env = local_environment(cwd, self.settings, tmpdir="/tmp" if isolate else None)
        if isolate:
            sandbox = self._keep(
                "_sandbox", BwrapSandbox(bwrap, cwd, tmp, self._env, self.settings.sandbox_network)
            )
            try:
                sandbox.start()
            except SandboxError:
                self.close()
                raise
            if not os.path.realpath(self._shell).startswith("/usr/"):
                self._shell = "/bin/sh"  # the host's bash is not in the sandbox's read-only system
            self.isolated = True
        with self._lock:
            if self._closed:
                raise SandboxError("environment closed while it started")
            self._started = True

    def _keep(self, attribute: str, resource):
        """Record a resource of :meth:`start` for :meth:`close`; if close() already ran, release it and raise."""
        with self._lock:
            if not self._closed:
                setattr(self, attribute, resource)
                return resource
        if isinstance(resource, str):
            shutil.rmtree(resource, ignore_errors=True)
        raise SandboxError("environment closed while it started")

    def close(self, interrupted: bool = False) -> None:
        """Kill every process of the prompt (SIGKILL), then remove the temp dirs we created.

        Under bubblewrap the whole sandbox goes (background processes included); in plain mode
        every process group started here. A ``cwd`` given to the constructor is kept.
        Idempotent; never raises; safe from another thread while :meth:`start` or
        :meth:`execute` runs. ``interrupted`` is accepted for protocol compatibility.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            groups, self._groups = self._groups, set()
            sandbox, tempdir, sandbox_tmp = self._sandbox, self._tempdir, self._sandbox_tmp
        if sandbox is not None:
            sandbox.close()
        for pgid in groups:
            _kill_group(pgid)
        for folder in (tempdir, sandbox_tmp):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)

    # -- commands ----------------------------------------------------------------

    def execute(self, command: str, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        """Run ``command`` with bash (else sh) ``-c`` in ``cwd`` (relative to the environment's cwd).

        Args:
            command: shell command line.
            cwd: directory to run in; default the environment's cwd.
            timeout: seconds; default ``settings.terminal_timeout``. On timeout the whole
                process group is killed and the result has returncode 124, ``timed_out=True``
                and the output read so far.

        Returns:
            ExecResult with merged stdout+stderr, bounded by ``settings.terminal_output_max_chars``
            (first 40% + last 60% with a marker; ``truncated=True``). A missing ``cwd``
            gives returncode 1 and a ``cd``-style message.

        Raises:
            SandboxError: the environment is not started or is closed, the process cannot be
                spawned, or the bubblewrap sandbox has ended.
        """
        if not self._started or self._closed:
            raise SandboxError("environment is not running (call start() first; close() ends it)")
        workdir = self._resolve(cwd) if cwd else self.cwd
        if not os.path.isdir(workdir):
            return ExecResult(returncode=1, output=f"cd: {cwd}: No such file or directory\n")
        limit = timeout if timeout is not None else self.settings.terminal_timeout
        env = {**self._env, "PWD": workdir}
        if self._sandbox is not None:
            proc = self._sandbox.spawn([self._shell, "-c", command], workdir, env)
        else:
            proc = self._spawn_plain(command, workdir, env)
        deadline = time.monotonic() + max(limit, 0.0)
        try:
            output, timed_out = self._collect(proc, deadline)
            if not timed_out:
                # EOF can come just before the shell exits (or it closed its stdout early).
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            proc.close_output()
            if proc.poll() is None:  # timed out, or interrupted while collecting
                proc.kill()
            try:
                proc.wait(timeout=_KILL_WAIT)
            except subprocess.TimeoutExpired:
                pass
            proc.done()
        if self._sandbox is not None and not self._sandbox.alive and not self._closed:
            raise SandboxError("the bubblewrap sandbox of this prompt has ended (was its agent killed?)")
        text, truncated = output.result()
        if timed_out:
            return ExecResult(returncode=124, output=text, truncated=truncated, timed_out=True)
        code = proc.returncode
        return ExecResult(returncode=-9 if code is None else code, output=text, truncated=truncated)

    def _spawn_plain(self, command: str, workdir: str, env: dict[str, str]) -> _HostProcess:
        """Start ``command`` as a host subprocess in its own session, under an ``sh`` holding only ``env``."""
        argv = ["/bin/sh", "-c", '"$0" -c "$1"; exit $?', self._shell, command]
        try:
            popen = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(f"cannot spawn shell: {exc}") from exc
        return _HostProcess(popen, self._groups, self._lock)

    def _collect(self, proc, deadline: float) -> tuple[BoundedOutput, bool]:
        """Read the pipe until EOF, or until the shell exited and the pipe went quiet, or the deadline."""
        output = BoundedOutput(self.settings.terminal_output_max_chars)
        fd = proc.fd
        os.set_blocking(fd, False)
        timed_out = False
        exited_at: float | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                if exited_at is None:
                    if proc.poll() is not None:
                        exited_at = now
                    elif now >= deadline:
                        timed_out = True
                        proc.kill()
                        exited_at = now
                if exited_at is not None and now - exited_at > _DRAIN_MAX:
                    break  # a leftover background child keeps writing; stop here
                wait = _QUIET if exited_at is not None else min(0.05, max(deadline - now, 0.0))
                if not selector.select(wait):
                    if exited_at is not None:
                        break  # the shell is gone and the pipe is quiet
                    continue
                try:
                    data = os.read(fd, _CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    break
                output.feed(data)
        output.feed(b"", final=True)
        return output, timed_out

    # -- files -------------------------------------------------------------------

    def _resolve(self, path: str, write: bool = False) -> str:
        """Absolute host path of ``path``: ``~`` is the prompt's folder (its HOME), relative paths join cwd.

        Under bubblewrap isolation the path is taken as the sandbox sees it: ``/tmp`` is the
        sandbox's private one; a path the sandbox cannot see raises FileNotFoundError, a write
        outside the writable folders PermissionError.
        """
        if path == "~" or path.startswith("~/"):
            path = self.cwd + path[1:]
        if not self._sandbox_tmp:
            return path if os.path.isabs(path) else os.path.join(self.cwd, path)
        path = os.path.normpath(path if os.path.isabs(path) else os.path.join(self.cwd, path))
        if not _within(path, self.cwd) and _within(path, "/tmp"):
            path = os.path.join(self._sandbox_tmp, os.path.relpath(path, "/tmp"))
        real = os.path.realpath(path)
        writable = (self.cwd, self._sandbox_tmp)
        if any(_within(real, root) for root in writable):
            return path
        if not any(_within(real, root) for root in ("/usr", "/etc")):
            raise FileNotFoundError(2, "No such file or directory (outside the sandbox)", path)
        if write:
            raise PermissionError(13, "Read-only file system (outside the sandbox's writable folders)", path)
        return path

    def read_file(self, path: str) -> bytes:
        """Return the bytes of ``path`` (relative to cwd, ``~`` = the prompt's folder).

        Raises:
            FileNotFoundError, IsADirectoryError, PermissionError: as ``open``.
        """
        with open(self._resolve(path), "rb") as fh:
            return fh.read()

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to cwd, ``~`` = the prompt's folder), creating parent directories.

        Raises:
            IsADirectoryError, PermissionError, OSError: as ``open``/``makedirs``.
        """
        target = self._resolve(path, write=True)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        with open(target, "wb") as fh:
            fh.write(data)


class _HostProcess:
    """A plain-mode command: a ``Popen`` leading its own process group, tracked for :meth:`LocalEnvironment.close`."""

    def __init__(self, popen: subprocess.Popen, groups: set[int], lock: threading.Lock):
        self._popen, self._groups, self._lock = popen, groups, lock
        self.fd = popen.stdout.fileno()
        self.pgid = popen.pid  # start_new_session: the child leads its own group
        with lock:
            groups.add(self.pgid)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._popen.wait(timeout=timeout)

    def kill(self) -> None:
        _kill_group(self.pgid)

    def close_output(self) -> None:
        self._popen.stdout.close()

    def done(self) -> None:
        """Forget the group once nothing of it is alive (a background child keeps it tracked)."""
        if not _group_alive(self.pgid):
            with self._lock:
                self._groups.discard(self.pgid)


def _within(path: str, root: str) -> bool:
    """True when absolute ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _kill_group(pgid: int) -> None:
    """SIGKILL a process group; a group already gone is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """True while some process of the group is alive (or a zombie not yet reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["LocalEnvironment"]
