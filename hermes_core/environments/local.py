"""Backend ``local``: a fresh temporary directory per prompt and plain subprocesses.

Several prompts run in one process (threads), so nothing here changes process-wide
state: no ``os.chdir``, no environment mutation. Each command runs in its own
process group (``start_new_session=True``) so a timeout or :meth:`LocalEnvironment.close`
kills the whole tree, grandchildren included.

Isolation (``settings.local_isolation``): with ``bwrap`` each command runs in a
bubblewrap sandbox: read-only ``/usr`` and ``/etc``, the prompt's directory and a
private ``/tmp`` writable, nothing else of the host visible, no network, a clean
environment (no API keys), its own PID namespace (so background processes end with
their command). The file methods see the same view.

Examples:
    >>> with LocalEnvironment() as env:
    ...     env.execute("echo hi").output
    'hi\\n'
"""

from __future__ import annotations

import codecs
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from hermes_core.environments import ExecResult, SandboxLifecycle
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings

_CHUNK = 64 * 1024
_QUIET = 0.05
"""After the shell exits, stop reading once the pipe is silent this long (seconds)."""
_DRAIN_MAX = 1.0
"""After the shell exits, stop reading after this long even if a leftover child still writes."""


class _BoundedOutput:
    """Decoded output kept as the first 40% and a rolling last 60% of ``max_chars``.

    Memory stays O(max_chars) whatever the command prints.
    """

    def __init__(self, max_chars: int):
        self.head_max = int(max_chars * 0.4)
        self.tail_max = max_chars - self.head_max
        self.head = ""
        self.tail = ""
        self.total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final=final)
        if not text:
            return
        self.total += len(text)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += text[:room]
            text = text[room:]
        if text:
            self.tail = (self.tail + text)[-self.tail_max :]

    def result(self) -> tuple[str, bool]:
        """(text, truncated); a cut text has the reference's middle marker."""
        kept = len(self.head) + len(self.tail)
        if kept >= self.total:
            return self.head + self.tail, False
        omitted = self.total - kept
        marker = f"\n... [OUTPUT TRUNCATED - {omitted} chars omitted out of {self.total} total] ...\n"
        return self.head + marker + self.tail, True


class LocalEnvironment(SandboxLifecycle):
    """Per-prompt sandbox on the host: its own working directory, commands in their own process groups.

    Args:
        cwd: working directory of the prompt (the record's ``cwd``). Created if missing
            and kept at :meth:`close`. None: a fresh ``hermes-*`` temporary directory,
            removed at :meth:`close`.
        settings: timeouts and the output bound; default ``HermesSettings()``.
        **_ignored: backend-neutral options of other backends (``image``, ``run_name``,
            ``prompt_id`` ...), accepted and ignored.

    Attributes:
        cwd: absolute working directory ("" until :meth:`start`).
    """

    def __init__(self, cwd: str | None = None, settings: HermesSettings | None = None, **_ignored: object):
        self.settings = settings or HermesSettings()
        self._requested_cwd = cwd
        self.cwd = ""
        self._tempdir: str | None = None
        self._bwrap = _bwrap_path(self.settings.local_isolation)
        self._sandbox_tmp: str | None = None  # host folder seen as /tmp inside the bubblewrap sandbox
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._shell = shutil.which("bash") or "/bin/sh"

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Create the working directory. Idempotent.

        Raises:
            SandboxError: the directory cannot be created, the environment was closed, or
                bubblewrap isolation was asked for and bwrap is missing or cannot run here.
        """
        if self._closed:
            raise SandboxError("environment already closed")
        if self._started:
            return
        try:
            if self._requested_cwd:
                self.cwd = os.path.abspath(os.path.expanduser(self._requested_cwd))
                os.makedirs(self.cwd, exist_ok=True)
            else:
                self._tempdir = os.path.realpath(tempfile.mkdtemp(prefix="hermes-"))
                self.cwd = self._tempdir
        except OSError as exc:
            raise SandboxError(f"cannot create working directory: {exc}") from exc
        self._started = True
        if self.settings.local_isolation == "bwrap" and not self._bwrap:
            self.close()
            raise SandboxError(
                "HERMES_LOCAL_ISOLATION=bwrap but bwrap is not installed (apt install bubblewrap)"
            )
        if self._bwrap:
            self._sandbox_tmp = os.path.realpath(tempfile.mkdtemp(prefix="hermes-sbtmp-"))
            probe = self.execute("true", timeout=30)
            if probe.returncode != 0:
                self.close()
                raise SandboxError(f"bubblewrap cannot create a sandbox here: {probe.output.strip()[:300]}")

    def close(self, interrupted: bool = False) -> None:
        """Kill every process group started here (SIGKILL), then remove the temp dir we created.

        A ``cwd`` given to the constructor is kept. Idempotent; never raises.
        ``interrupted`` is accepted for protocol compatibility (teardown is the same).
        """
        if self._closed:
            return
        self._closed = True
        with self._lock:
            groups, self._groups = self._groups, set()
        for pgid in groups:
            _kill_group(pgid)
        if self._tempdir:
            shutil.rmtree(self._tempdir, ignore_errors=True)
        if self._sandbox_tmp:
            shutil.rmtree(self._sandbox_tmp, ignore_errors=True)

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
            SandboxError: the environment is not started or is closed, or the process cannot be spawned.
        """
        if not self._started or self._closed:
            raise SandboxError("environment is not running (call start() first; close() ends it)")
        workdir = self._resolve(cwd) if cwd else self.cwd
        if not os.path.isdir(workdir):
            return ExecResult(returncode=1, output=f"cd: {cwd}: No such file or directory\n")
        limit = timeout if timeout is not None else self.settings.terminal_timeout
        argv = [self._shell, "-c", command]
        if self._bwrap:
            argv = self._bwrap_argv(workdir) + argv
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        else:
            env = dict(os.environ, PWD=workdir)
        try:
            proc = subprocess.Popen(
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
        pgid = proc.pid  # start_new_session: the child leads its own group
        with self._lock:
            self._groups.add(pgid)
        deadline = time.monotonic() + max(limit, 0.0)
        try:
            output, timed_out = self._collect(proc, pgid, deadline)
            if not timed_out:
                # EOF can come just before the shell exits (or it closed its stdout early).
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            proc.stdout.close()
            if proc.poll() is None:  # timed out, or interrupted while collecting
                _kill_group(pgid)
            proc.wait()
            if not _group_alive(pgid):
                with self._lock:
                    self._groups.discard(pgid)
        text, truncated = output.result()
        if timed_out:
            return ExecResult(returncode=124, output=text, truncated=truncated, timed_out=True)
        return ExecResult(returncode=proc.returncode, output=text, truncated=truncated)

    def _collect(self, proc: subprocess.Popen, pgid: int, deadline: float) -> tuple[_BoundedOutput, bool]:
        """Read the pipe until EOF, or until the shell exited and the pipe went quiet, or the deadline."""
        output = _BoundedOutput(self.settings.terminal_output_max_chars)
        fd = proc.stdout.fileno()
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
                        _kill_group(pgid)
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

    def _bwrap_argv(self, workdir: str) -> list[str]:
        """The bubblewrap command line (before the shell) of one command run in ``workdir``."""
        argv = [self._bwrap, "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            top = "/" + name
            if os.path.islink(top):
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        argv += ["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--bind", self._sandbox_tmp, "/tmp", "--bind", self.cwd, self.cwd, "--chdir", workdir]
        argv += ["--unshare-all", "--die-with-parent", "--clearenv"]
        for name, value in (
            ("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"),
            ("HOME", self.cwd),
            ("PWD", workdir),
            ("LANG", os.environ.get("LANG", "C.UTF-8")),
            ("TERM", "dumb"),
        ):
            argv += ["--setenv", name, value]
        return [*argv, "--"]

    # -- files -------------------------------------------------------------------

    def _resolve(self, path: str, write: bool = False) -> str:
        """Absolute host path of ``path``: ``~`` expanded, relative paths joined to cwd.

        Under bubblewrap isolation the path is taken as the sandbox sees it: ``~`` is the
        prompt's directory, ``/tmp`` the sandbox's private one; a path the sandbox cannot see
        raises FileNotFoundError, a write outside the writable folders PermissionError.
        """
        if not self._bwrap or not self._sandbox_tmp:
            path = os.path.expanduser(path)
            return path if os.path.isabs(path) else os.path.join(self.cwd, path)
        if path == "~" or path.startswith("~/"):
            path = self.cwd + path[1:]
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
        """Return the bytes of ``path`` (relative to cwd, ``~`` expanded).

        Raises:
            FileNotFoundError, IsADirectoryError, PermissionError: as ``open``.
        """
        with open(self._resolve(path), "rb") as fh:
            return fh.read()

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to cwd, ``~`` expanded), creating parent directories.

        Raises:
            IsADirectoryError, PermissionError, OSError: as ``open``/``makedirs``.
        """
        target = self._resolve(path, write=True)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        with open(target, "wb") as fh:
            fh.write(data)


def _bwrap_path(isolation: str) -> str | None:
    """Path of ``bwrap`` when ``isolation`` asks for it (``bwrap``, or ``auto`` and installed), else None."""
    if isolation == "none":
        return None
    return shutil.which("bwrap")


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
