"""Backend ``local``: a fresh temporary directory per prompt, isolated by bubblewrap when it can be.

Several prompts run in one process (threads), so nothing here changes process-wide
state: no ``os.chdir``, no environment mutation.

Isolation (``settings.local_isolation``, see :mod:`hermes_core.environments.isolation`): under
bubblewrap (``auto`` with a working ``bwrap``, or ``bwrap``) each prompt gets one long-lived
sandbox (:class:`~hermes_core.environments.bwrap.BwrapSandbox`): read-only system, only the
prompt's folder (its ``HOME``) and a private ``/tmp`` writable, its own pid namespace, no host
home folders, run folder, other prompts or Docker socket; network as ``settings.sandbox_network``
(``outbound``: the internet only, :mod:`hermes_core.environments.outbound`). The sandbox starts
at the prompt's first command or file access, not before: a prompt that never uses it pays
nothing. Background processes live on between commands; :meth:`close` kills every process of
the prompt. The file methods are carried out *inside* the sandbox (its agent opens the file and
hands the descriptor over), so they see exactly what its commands see. Without bubblewrap
(``none``, or ``auto`` where it cannot run) commands are plain host subprocesses.

The record's ``cwd`` is never a host folder mounted writable: a relative one is a folder inside
the prompt's folder, an absolute one is copied in (:mod:`hermes_core.environments.workdir`).

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
import stat
import subprocess
import threading
import time

from hermes_core.environments import ExecResult, SandboxLifecycle
from hermes_core.environments.bwrap import BwrapSandbox
from hermes_core.environments.isolation import bwrap_problem, sandbox_network, uses_bwrap
from hermes_core.environments.output import BoundedOutput
from hermes_core.environments.poll import wait_process
from hermes_core.environments.programs import find_program
from hermes_core.environments.sandbox_env import local_environment
from hermes_core.environments.scratch import make_temp_dir
from hermes_core.environments.workdir import cwd_problem, prepare_workdir
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings

_CHUNK = 64 * 1024
_QUIET = 0.05
"""After the shell exits, stop reading once the pipe is silent this long (seconds)."""
_DRAIN_MAX = 1.0
"""After the shell exits, stop reading after this long even if a leftover child still writes."""
_KILL_WAIT = 10.0
"""Longest wait for a killed command's exit status, seconds."""
MAX_FILE_BYTES = 64 << 20
"""Largest file :meth:`LocalEnvironment.read_file` returns (larger: OSError EFBIG); the file tools read less."""
_READ_FLAGS = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC


class LocalEnvironment(SandboxLifecycle):
    """Per-prompt sandbox on the host: its own working directory, commands in their own process groups.

    Args:
        cwd: the record's ``cwd``: relative (a folder made inside the prompt's folder) or an
            absolute host folder copied into it (:mod:`hermes_core.environments.workdir`; a
            refused one makes :meth:`start` raise SandboxError). None: the prompt's folder.
        settings: isolation, network, ``sandbox_env``, timeouts and the output bound;
            default ``HermesSettings()``.
        environment: the exact environment of every command, for trusted host tools only (the
            singularity backend runs ``apptainer`` this way); it also turns isolation off.
            None: the sandbox allow-list.
        **_ignored: backend-neutral options of other backends (``image``, ``run_name``,
            ``run_id``, ``prompt_id`` ...), accepted and ignored.

    Attributes:
        cwd: absolute working directory ("" until :meth:`start`).
        home: the prompt's folder: a fresh ``hermes-*`` temporary directory, the commands'
            ``HOME`` and what ``~`` means in file paths; removed at :meth:`close`.
        isolated: True once :meth:`start` decided that commands run in a bubblewrap sandbox
            (started at the first command or file access).
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
        self.home = ""
        self.isolated = False
        self._tempdir: str | None = None
        self._sandbox_tmp: str | None = None  # host folder seen as /tmp inside the bubblewrap sandbox
        self._sandbox: BwrapSandbox | None = None
        self._sandbox_starting = threading.Lock()
        self._env: dict[str, str] = {}
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._shell = find_program("bash") or "/bin/sh"

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Create the prompt's folder and working directory; decide isolation. Idempotent.

        The bubblewrap sandbox itself starts at the first command or file access. Safe against
        :meth:`close` called from another thread meanwhile: then nothing is left running or
        created, and SandboxError is raised.

        Raises:
            SandboxError: the folders cannot be created or the ``cwd`` is refused, the environment
                was closed, or bubblewrap isolation is required (``HERMES_LOCAL_ISOLATION=bwrap``)
                and bwrap is missing or cannot build a sandbox here.
        """
        if self._closed:
            raise SandboxError("environment already closed")
        if self._started:
            return
        isolate = self._environment is None and uses_bwrap(self.settings)
        if isolate and self.settings.local_isolation == "bwrap":
            problem = bwrap_problem()
            if problem:
                raise SandboxError(
                    f"HERMES_LOCAL_ISOLATION=bwrap but bubblewrap cannot isolate here: {problem} "
                    "(apt-get install bubblewrap, or HERMES_LOCAL_ISOLATION=none)"
                )
        requested = self._requested_cwd
        if requested:
            problem = cwd_problem(requested, roots=self.settings.cwd_roots or ["/"])
            if problem:
                raise SandboxError(f"cannot use the record's cwd: {problem}")
        try:
            home = self._keep("_tempdir", make_temp_dir("hermes-"))
            cwd = prepare_workdir(home, requested)
            if isolate:
                self._keep("_sandbox_tmp", make_temp_dir("hermes-sbtmp-"))
        except (OSError, ValueError, shutil.Error) as exc:
            self.close()
            raise SandboxError(f"cannot create working directory: {exc}") from exc
        self.home, self.cwd = home, cwd
        if self._environment is not None:
            self._env = dict(self._environment)
        else:
            self._env = local_environment(home, self.settings, tmpdir="/tmp" if isolate else None)
        if isolate:  # the sandbox has only /usr of the host: the shell by its real path there
            real = os.path.realpath(self._shell)
            self._shell = real if real.startswith("/usr/") else "/bin/sh"
        with self._lock:
            if self._closed:
                raise SandboxError("environment closed while it started")
            self.isolated = isolate
            self._started = True

    def _keep(self, attribute: str, resource):
        """Record a resource of :meth:`start` for :meth:`close`; if close() already ran, release it and raise."""
        with self._lock:
            if not self._closed:
                setattr(self, attribute, resource)
                return resource
        if isinstance(resource, str):
            shutil.rmtree(resource, ignore_errors=True)
        elif isinstance(resource, BwrapSandbox):
            resource.close()
        raise SandboxError("environment closed while it started")

    def _running_sandbox(self) -> BwrapSandbox | None:
        """The prompt's bubblewrap sandbox, started now if this is its first use; None when not isolated.

        Raises:
            SandboxError: the environment is not started or closed, or the sandbox cannot start.
        """
        if not self._started or self._closed:
            raise SandboxError("environment is not running (call start() first; close() ends it)")
        if not self.isolated:
            return None
        sandbox = self._sandbox
        if sandbox is not None:
            return sandbox
        with self._sandbox_starting:
            if self._sandbox is None:
                sandbox = BwrapSandbox(
                    find_program("bwrap") or "bwrap",
                    self.home,
                    self._sandbox_tmp,
                    self._env,
                    sandbox_network(self.settings),
                    allowed_networks=tuple(self.settings.sandbox_allow_networks),
                )
                self._keep("_sandbox", sandbox)
                try:
                    sandbox.start()
                except SandboxError:
                    self.close()
                    raise
            return self._sandbox

    def close(self, interrupted: bool = False) -> None:
        """Kill every process of the prompt (SIGKILL), then remove the folders this environment made.

        Under bubblewrap the whole sandbox goes (background processes included); in plain mode
        every process group started here. Idempotent; never raises; safe from another thread
        while :meth:`start` or :meth:`execute` runs. ``interrupted`` is accepted for protocol
        compatibility.
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
            cwd: directory to run in (``~`` is the prompt's folder); default the environment's cwd.
            timeout: seconds; default ``settings.terminal_timeout``. On timeout the whole
                process group is killed and the result has returncode 124, ``timed_out=True``
                and the output read so far.

        Returns:
            ExecResult with merged stdout+stderr, bounded by ``settings.terminal_output_max_chars``
            (first 40% + last 60% with a marker; ``truncated=True``). A missing ``cwd`` (as the
            sandbox sees it) gives returncode 1 and a ``cd``-style message.

        Raises:
            SandboxError: the environment is not started or is closed, the process cannot be
                spawned, or the bubblewrap sandbox has ended.
            ValueError: the command or ``cwd`` holds a NUL byte.
        """
        sandbox = self._running_sandbox()
        workdir = self._path(cwd) if cwd else self.cwd
        if "\0" in command or "\0" in workdir:
            raise ValueError("embedded null byte")
        if sandbox is None and not os.path.isdir(workdir):
            return ExecResult(returncode=1, output=f"cd: {cwd}: No such file or directory\n")
        limit = timeout if timeout is not None else self.settings.terminal_timeout
        env = {**self._env, "PWD": workdir}
        if sandbox is not None:
            proc = sandbox.spawn([self._shell, "-c", command], workdir, env)
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
        if sandbox is not None and not sandbox.alive and not self._closed:
            raise SandboxError(
                sandbox.failure or "the bubblewrap sandbox of this prompt has ended (was its agent killed?)"
            )
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
        # A sandbox's command has an exit descriptor: wait on it, not in 50 ms polls of its status.
        exit_fd = proc.exit_fd
        poll_every = 0.05 if exit_fd is None else None
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            if exit_fd is not None:
                selector.register(exit_fd, selectors.EVENT_READ)
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
                if exited_at is not None:
                    wait = _QUIET
                else:
                    wait = max(deadline - now, 0.0)
                    wait = min(poll_every, wait) if poll_every is not None else wait
                ready = {key.fd for key, _ in selector.select(wait)}
                if exit_fd in ready:  # the status is known: poll() says so from now on
                    selector.unregister(exit_fd)
                    exit_fd = None
                    continue  # level-triggered: output that is ready too comes at the next select
                if fd not in ready:
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

    def _path(self, path: str) -> str:
        """The absolute path of ``path`` as the commands see it: ``~`` is the prompt's folder, relative joins cwd.

        No check and no symlink resolution happens here: under bubblewrap the sandbox resolves
        the path itself when it opens the file (:meth:`BwrapSandbox.open`).
        """
        if path == "~" or path.startswith("~/"):
            path = self.home + path[1:]
        return path if os.path.isabs(path) else os.path.join(self.cwd, path)

    def read_file(self, path: str) -> bytes:
        """Return the bytes of ``path`` (relative to cwd, ``~`` = the prompt's folder), as the commands see it.

        Raises:
            FileNotFoundError, IsADirectoryError, PermissionError, OSError: as ``open`` in the
                sandbox (EFBIG over :data:`MAX_FILE_BYTES`; EINVAL for a device, FIFO or socket).
            ValueError: the path holds a NUL byte.
            SandboxError: the environment is not running.
        """
        sandbox = self._running_sandbox()
        target = self._path(path)
        fd = sandbox.open(target, _READ_FLAGS) if sandbox is not None else os.open(target, _READ_FLAGS)
        try:
            _check_regular(fd, path)
            chunks, size = [], 0
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                if size > MAX_FILE_BYTES:
                    raise OSError(27, f"File too large to read (over {MAX_FILE_BYTES} bytes)", path)
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to cwd, ``~`` = the prompt's folder), creating parent directories.

        Raises:
            IsADirectoryError, PermissionError, OSError: as ``open``/``makedirs`` in the sandbox
                (a write outside its writable folders: EROFS or EACCES).
            ValueError: the path holds a NUL byte.
            SandboxError: the environment is not running.
        """
        sandbox = self._running_sandbox()
        target = self._path(path)
        if sandbox is not None:
            fd = sandbox.open(target, _WRITE_FLAGS, 0o666, parents=True)
        else:
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            fd = os.open(target, _WRITE_FLAGS, 0o666)
        try:
            _check_regular(fd, path)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def _check_regular(fd: int, path: str) -> None:
    """Raise unless ``fd`` is a regular file (IsADirectoryError for a folder, EINVAL for anything else)."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(21, "Is a directory", path)
    if not stat.S_ISREG(mode):
        raise OSError(22, "Not a regular file (device, FIFO or socket)", path)


class _HostProcess:
    """A plain-mode command: a ``Popen`` leading its own process group, tracked for :meth:`LocalEnvironment.close`."""

    exit_fd = None
    """No exit descriptor: the reader polls :meth:`poll` (the sandbox's commands have one)."""

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
        return wait_process(self._popen, timeout)

    def kill(self) -> None:
        _kill_group(self.pgid)

    def close_output(self) -> None:
        self._popen.stdout.close()

    def done(self) -> None:
        """Forget the group once nothing of it is alive (a background child keeps it tracked)."""
        if not _group_alive(self.pgid):
            with self._lock:
                self._groups.discard(self.pgid)


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
