"""One long-lived bubblewrap sandbox per prompt, with a small agent inside that runs its commands.

Why an agent: each command used to be its own ``bwrap`` with its own pid namespace, so a
background process died with the command that started it. Joining a running sandbox from
outside (``nsenter``) needs privileges an ordinary user does not have in bubblewrap's nested
user namespaces. So :meth:`BwrapSandbox.start` starts ``bwrap ... python3 -I -S -c AGENT``: the
agent (stdlib only) is the sandbox's first process after bubblewrap's own init; the host sends
it, over a socketpair, one request per command (the request itself and the write end of the
output pipe travel as file descriptors, ``SCM_RIGHTS``), the agent forks the command in a new
session and reports its exit status. Every command of the prompt therefore shares one mount
and pid namespace: background processes outlive the command that started them and ``kill -0``
sees them; the agent kills a command's process group on timeout; :meth:`BwrapSandbox.close`
SIGKILLs the namespace's init, which makes the kernel kill every process of the prompt.
When this Python process dies, the socket closes, the agent exits and the namespace goes too.

The sandbox: ``/usr``, ``/etc`` (and the ``/bin``, ``/lib*`` links) read-only; the prompt's
folder (also ``HOME``) and a private ``/tmp`` writable; fresh ``/proc`` and ``/dev``; no
``/root``, ``/home``, ``/run``, ``/var`` (so no Docker socket), no run folder, no other prompt;
all capabilities dropped; own pid, ipc, uts, cgroup (and, when asked, network) namespaces;
the environment given (an allow-list, see :mod:`hermes_core.environments.sandbox_env`).
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from hermes_core.environments._poll import readable
from hermes_core.exceptions import SandboxError

AGENT = r"""
import os, select, sys, _signal, _socket
sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, int(sys.argv[1]))
os.set_inheritable(sock.fileno(), False)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
_signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
_signal.signal(_signal.SIGCHLD, lambda *_: None)
running = {}

def spawn(spec, out):
    fields = spec.split(b"\0")
    ident, cwd, argc = int(fields[0]), fields[1], int(fields[2])
    argv = fields[3 : 3 + argc]
    env = dict(entry.split(b"=", 1) for entry in fields[3 + argc :])
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            os.write(2, ("hermes sandbox: cannot run the command: %s\n" % exc).encode())
        os._exit(127)
    running[pid] = ident

def reap():
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ident = running.pop(pid, None)
        if ident is not None:
            sock.send(b"%d %d" % (ident, os.waitstatus_to_exitcode(status)))

def read_all(fd):
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data

# poll, not select: the socket keeps the host's descriptor number, >= 1024 with hundreds of prompts
poller = select.poll()
poller.register(sock.fileno(), select.POLLIN)
poller.register(wake_r, select.POLLIN)
try:
    sock.send(b"ready")
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
            reap()
        if sock.fileno() in ready:
            msg, anc, _, _ = sock.recvmsg(4096, _socket.CMSG_SPACE(8))
            if not msg:
                break
            fds = []
            for level, kind, data in anc:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(data[i : i + 4], sys.byteorder, signed=True) for i in range(0, len(data) - 3, 4)]
            op, _, ident = msg.partition(b" ")
            if op == b"run":
                spawn(read_all(fds[0]), fds[1])
                os.close(fds[1])
            elif op == b"kill":
                for pid, running_ident in list(running.items()):
                    if running_ident == int(ident):
                        try:
                            os.killpg(pid, 9)
                        except ProcessLookupError:
                            pass
finally:
    for pid in running:
        try:
            os.killpg(pid, 9)
        except ProcessLookupError:
            pass
"""
"""Source of the agent run inside the sandbox; ``argv[1]`` is the fd of its socket.

It imports only modules built into the interpreter or C extensions (``_socket``, ``_signal``,
``select``; no ``json``, ``socket``, ``signal``: their pure-Python imports took 13.6 of the
agent's 21 ms CPU start-up, paid once per prompt). The protocol, one message per datagram:
``ready`` (agent), ``run <id>`` with two descriptors: a file holding the command and the write
end of its output pipe (host), ``kill <id>`` (host), ``<id> <exit status>`` (agent). The command
file is ``id NUL cwd NUL argc NUL argv... NUL KEY=VALUE...``: none of these can hold a NUL
(``execve`` takes NUL-terminated strings), so the split is exact."""

_START_TIMEOUT = 30.0
"""Longest wait for a new sandbox's agent to report ready, seconds."""


def agent_interpreter() -> tuple[str, list[str]]:
    """The Python that runs the agent inside the sandbox, and the host folders to bind for it.

    Prefers an interpreter under ``/usr`` (visible in the sandbox anyway): this process's own,
    else ``/usr/bin/python3`` / ``/usr/local/bin/python3``. Otherwise this process's base
    interpreter, with its installation folder (``sys.base_prefix``) bound read-only.

    Returns:
        (absolute path of the interpreter, folders to bind read-only at the same path).
    """
    candidates = (
        sys.executable,
        getattr(sys, "_base_executable", ""),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    )
    for candidate in candidates:
        real = os.path.realpath(candidate) if candidate else ""
        if real and _within(real, "/usr") and os.access(real, os.X_OK):
            return real, []
    return os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable), [sys.base_prefix]


def sandbox_argv(bwrap: str, home: str, tmp: str, network: bool, extra_ro: list[str]) -> list[str]:
    """The bubblewrap options (up to and without the command) of a prompt's sandbox.

    Args:
        bwrap: path of ``bwrap``.
        home: the prompt's folder, bound writable at the same path (the commands' cwd and HOME).
        tmp: host folder bound writable at ``/tmp``.
        network: keep the host's network namespace (``--share-net``); False: only a private loopback.
        extra_ro: more host folders bound read-only at the same path.
    """
    argv = [bwrap, "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = "/" + name
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--ro-bind", "/etc", "/etc"]
    resolv = os.path.realpath("/etc/resolv.conf")
    if network and not _within(resolv, "/etc") and os.path.isfile(resolv):
        argv += ["--ro-bind", resolv, resolv]  # systemd-resolved keeps it under /run
    for folder in extra_ro:
        argv += ["--ro-bind", folder, folder]
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", tmp, "/tmp", "--bind", home, home]
    argv += ["--unshare-all", *(["--share-net"] if network else []), "--cap-drop", "ALL", "--new-session"]
    return [*argv, "--chdir", home]


class SandboxProcess:
    """A command running in a :class:`BwrapSandbox`; the part of ``subprocess.Popen`` the local backend uses.

    Attributes:
        fd: host end (read) of the pipe holding the command's merged stdout and stderr.
        returncode: exit status once known (negative: killed by that signal), else None.
    """

    def __init__(self, sandbox: BwrapSandbox, ident: int, fd: int):
        self._sandbox, self._ident, self.fd = sandbox, ident, fd
        self.returncode: int | None = None
        self._done = threading.Event()

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status. Raises subprocess.TimeoutExpired after ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired("sandbox command", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the command's process group (no-op once the sandbox is gone)."""
        self._sandbox._send(b"kill %d" % self._ident)

    def close_output(self) -> None:
        """Close the host end of the output pipe."""
        os.close(self.fd)

    def done(self) -> None:
        """Nothing to forget: :meth:`BwrapSandbox.close` kills the whole sandbox."""


class BwrapSandbox:
    """The long-lived bubblewrap sandbox of one prompt (see the module docstring).

    Args:
        bwrap: path of ``bwrap``.
        home: the prompt's folder (absolute, existing).
        tmp: host folder to show as ``/tmp`` (absolute, existing).
        env: environment of the agent and default of its commands.
        network: share the host's network (else a private loopback only).
        extra_ro: more host folders to bind read-only at the same path.
    """

    def __init__(
        self, bwrap: str, home: str, tmp: str, env: dict[str, str], network: bool, extra_ro: list[str] = ()
    ):
        python, binds = agent_interpreter()
        self._argv = sandbox_argv(bwrap, home, tmp, network, [*binds, *extra_ro])
        self._python, self._env = python, env
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._pidfd: int | None = None
        self._info_r: int | None = None
        self._init_pid = 0
        self._lock = threading.Lock()
        self._procs: dict[int, SandboxProcess] = {}
        self._next = 0
        self._ended = False
        self._closed = False

    def start(self) -> None:
        """Start bubblewrap and the agent; return once the agent is ready (at most 30 s).

        Raises:
            SandboxError: bubblewrap could not build the sandbox (the message has its error output).
        """
        host, agent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()  # info_r stays open until close(): bubblewrap must never get SIGPIPE
        argv = [*self._argv, "--info-fd", str(info_w), "--", self._python, "-I", "-S", "-c", AGENT]
        with tempfile.TemporaryFile() as errors:
            try:
                with self._lock:  # a concurrent close() waits for this, then kills what started
                    if self._closed:
                        host.close()
                        os.close(info_r)
                        raise SandboxError("the sandbox was closed before it started")
                    self._sock, self._info_r = host, info_r
                    self._proc = subprocess.Popen(
                        [*argv, str(agent.fileno())],
                        env=self._env,
                        cwd="/",
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=errors,
                        pass_fds=(agent.fileno(), info_w),
                        start_new_session=True,
                    )
            except OSError as exc:
                self.close()
                raise SandboxError(f"cannot run bubblewrap: {exc}") from exc
            finally:
                agent.close()  # from now on only bubblewrap holds these: its exit is our EOF
                os.close(info_w)
            ready = readable(host, _START_TIMEOUT) and _recv(host)
            if ready:
                self._init_pid = _read_child_pid(info_r)
            if not ready:
                closed = self._closed
                self.close()
                if closed:
                    raise SandboxError("the sandbox was closed while it started")
                errors.seek(0)
                reason = errors.read().decode("utf-8", "replace").strip() or "the agent did not start"
                raise SandboxError(f"bubblewrap cannot create a sandbox here: {reason[-500:]}")
        if self._init_pid:
            try:
                self._pidfd = os.pidfd_open(self._init_pid)
            except (AttributeError, OSError):
                self._pidfd = None
        threading.Thread(target=self._read_replies, name="hermes-bwrap", daemon=True).start()
        if self._closed:  # close() ran while the agent was starting (it may not have known its init)
            self.close()
            raise SandboxError("the sandbox was closed while it started")

    def spawn(self, argv: list[str], cwd: str, env: dict[str, str]) -> SandboxProcess:
        """Run ``argv`` in the sandbox in ``cwd`` with exactly ``env``; stdin is /dev/null.

        Raises:
            SandboxError: the sandbox is gone (closed, or its agent was killed).
            ValueError: an argument, the folder or a variable holds a NUL byte (as ``subprocess``).
        """
        with self._lock:
            self._next += 1
            ident = self._next
        command = command_spec(ident, argv, cwd, env)
        out_r, out_w = os.pipe()
        with self._lock:
            proc = self._procs[ident] = SandboxProcess(self, ident, out_r)
        spec = os.memfd_create("hermes-spec", os.MFD_CLOEXEC)
        try:
            os.write(spec, command)
            os.lseek(spec, 0, os.SEEK_SET)
            if not self._send(b"run %d" % proc._ident, [spec, out_w]):
                with self._lock:
                    self._procs.pop(proc._ident, None)
                os.close(out_r)
                raise SandboxError("the bubblewrap sandbox has ended")
        finally:
            os.close(spec)
            os.close(out_w)
        return proc

    def _send(self, message: bytes, fds: list[int] = ()) -> bool:
        """Send one request to the agent (see :data:`AGENT`); False when the sandbox is gone."""
        if self._ended or self._sock is None:
            return False
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            with self._lock:
                self._sock.sendmsg([message], ancillary)
        except OSError:
            return False
        return True

    def _read_replies(self) -> None:
        """Thread: deliver exit statuses; when the agent is gone, end every pending command (-9)."""
        sock = self._sock
        while True:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                break
            ident, _, code = data.partition(b" ")
            with self._lock:
                proc = self._procs.pop(int(ident), None)
            if proc is not None:
                proc._finish(int(code))
        self._ended = True
        with self._lock:
            pending, self._procs = list(self._procs.values()), {}
        for proc in pending:
            proc._finish(-signal.SIGKILL)

    @property
    def alive(self) -> bool:
        """True while the agent answers requests."""
        return not self._ended and self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Kill every process of the sandbox (SIGKILL to its pid namespace's init) and wait for bubblewrap.

        Idempotent and safe from another thread while :meth:`start` runs (then ``start`` raises
        SandboxError and nothing of the sandbox keeps running).
        """
        with self._lock:
            self._closed = self._ended = True
            proc, info_r, self._info_r = self._proc, self._info_r, None
            pidfd, self._pidfd = self._pidfd, None  # taken once: close() may run in two threads at once
        if proc is not None and not self._init_pid and info_r is not None:
            self._init_pid = _read_child_pid(info_r)  # closed while starting: learn the init to kill
        if pidfd is not None:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            os.close(pidfd)
        elif self._init_pid:
            try:
                os.kill(self._init_pid, signal.SIGKILL)
            except OSError:
                pass
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # the agent sees EOF even if init is not known
            except OSError:
                pass
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if info_r is not None:
            os.close(info_r)
        if self._sock is not None:
            self._sock.close()


def command_spec(ident: int, argv: list[str], cwd: str, env: dict[str, str]) -> bytes:
    """The command file of a ``run`` request (format in :data:`AGENT`), names encoded as the OS does.

    Raises:
        ValueError: a field holds a NUL byte (``subprocess`` refuses those the same way).
    """
    fields = [str(ident), cwd, str(len(argv)), *argv, *(f"{key}={value}" for key, value in env.items())]
    data = [os.fsencode(field) for field in fields]
    if any(b"\0" in field for field in data):
        raise ValueError("embedded null byte")
    return b"\0".join(data)


def _recv(sock: socket.socket) -> bytes:
    """One message from ``sock``; b"" at EOF or when the socket was shut down or closed meanwhile."""
    try:
        return sock.recv(4096)
    except OSError:
        return b""


def _read_child_pid(fd: int) -> int:
    """The ``child-pid`` of bubblewrap's ``--info-fd`` JSON (its pid namespace's init); 0 if unreadable."""
    data = b""
    deadline = time.monotonic() + 5
    while b"}" not in data and time.monotonic() < deadline:
        if not readable(fd, deadline - time.monotonic()):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return 0


def _within(path: str, root: str) -> bool:
    """True when absolute ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")
