"""One long-lived bubblewrap sandbox per prompt, with a small agent inside that runs its commands.

Why an agent: each command used to be its own ``bwrap`` with its own pid namespace, so a
background process died with the command that started it. Joining a running sandbox from
outside (``nsenter``) needs privileges an ordinary user does not have in bubblewrap's nested
user namespaces. So :meth:`BwrapSandbox.start` starts ``bwrap ... <agent> <fd>``: the agent is
the sandbox's first process after bubblewrap's own init; the host sends it, over a socketpair,
one request per command (the request itself and the write end of the output pipe travel as
file descriptors, ``SCM_RIGHTS``), the agent forks the command in a new session and reports its
exit status. Every command of the prompt therefore shares one mount and pid namespace:
background processes outlive the command that started them and ``kill -0`` sees them; the
agent kills a command's process group on timeout; :meth:`BwrapSandbox.close` SIGKILLs the
namespace's init, which makes the kernel kill every process of the prompt. When this Python
process dies, the socket closes, the agent exits and the namespace goes too.

Two agents speak the same protocol (:data:`AGENT`) and behave the same: the native one,
``sandbox_agent.c`` compiled once per machine by :mod:`hermes_core.environments.native_agent`
(``HERMES_SANDBOX_AGENT=auto|native|python``), shown in the sandbox as
:data:`NATIVE_AGENT_PATH`, used whenever it can be built: its start costs a fraction of a
millisecond of CPU where starting ``python3 -I -S -c AGENT`` costs ~14 ms, per prompt; and
that Python program (stdlib only) otherwise.

The sandbox: ``/usr``, ``/etc`` (and the ``/bin``, ``/lib*`` links) read-only; the prompt's
folder (also ``HOME``) and a private ``/tmp`` writable; fresh ``/proc`` and ``/dev``; no
``/root``, ``/home``, ``/run``, ``/var`` (so no Docker socket), no run folder, no other prompt;
all capabilities dropped; own pid, ipc, uts, cgroup (and, when asked, network) namespaces;
the environment given (an allow-list, see :mod:`hermes_core.environments.sandbox_env`).

Network on demand: an ``outbound`` sandbox's network (slirp4netns and its routes,
:mod:`hermes_core.environments.outbound`) is attached only when one of its commands first opens a
network socket; the native agent holds that ``socket`` call until then (a seccomp filter, see
``sandbox_agent.c``). A prompt whose commands never use the network never pays for it.
"""

from __future__ import annotations

import array
import atexit
import functools
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from hermes_core.environments.native_agent import native_agent
from hermes_core.environments.outbound import OutboundNetwork, resolv_conf
from hermes_core.environments.poll import readable, wait_process
from hermes_core.environments.scratch import make_temp_dir
from hermes_core.exceptions import SandboxError

logger = logging.getLogger(__name__)

AGENT = r"""
import errno, os, select, sys, _signal, _socket
sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, int(sys.argv[1]))
os.set_inheritable(sock.fileno(), False)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
_signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
_signal.signal(_signal.SIGCHLD, lambda *_: None)
running = {}
MAX_SPEC = 8 << 20

def not_started(ident, out, err):
    try:
        os.write(out, b"hermes sandbox: cannot run the command: %s\n" % os.strerror(err).encode())
    except OSError:
        pass
    sock.send(b"%d 127" % ident)

def spawn(spec, out):
    fields = spec.split(b"\0")
    ident, cwd, argc = int(fields[0]), fields[1], int(fields[2])
    if not 0 <= argc <= len(fields) - 3:
        raise ValueError("bad argument count")
    argv = fields[3 : 3 + argc]
    env = dict(entry.split(b"=", 1) for entry in fields[3 + argc :])
    try:
        pid = os.fork() if argv else -errno.EINVAL
    except OSError as exc:
        pid = -(exc.errno or errno.EAGAIN)
    if pid < 0:  # as a command that could not start, instead of losing the request
        not_started(ident, out, -pid)
        return
    if pid == 0:
        try:
            _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)  # Python ignores these; commands must not
            _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
            os.setsid()
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            try:
                os.chdir(cwd)
            except OSError as exc:
                os.write(2, b"cd: %s: %s\n" % (cwd, (exc.strerror or "cannot enter").encode()))
                os._exit(1)
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            os.write(2, b"hermes sandbox: cannot run the command: %s\n" % why.encode())
        os._exit(127)
    running[pid] = ident

def reap():
    while True:  # orphans too: the agent is the pid namespace's init, they are its children
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ident = running.pop(pid, None)
        if ident is not None:
            sock.send(b"%d %d" % (ident, os.waitstatus_to_exitcode(status)))

def open_file(spec):
    ident, flags, mode, parents, path = spec.split(b"\0", 4)
    try:
        if parents == b"1":
            head = os.path.dirname(path)
            if head:
                os.makedirs(head, exist_ok=True)
        fd = os.open(path, int(flags), int(mode))
    except OSError as exc:
        sock.send(b"%s E%d" % (ident, exc.errno or 5))
        return
    try:
        sock.sendmsg([b"%s F" % ident], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd.to_bytes(4, sys.byteorder, signed=True))])
    finally:
        os.close(fd)

def kill_group(pid):
    try:
        os.killpg(pid, 9)
    except ProcessLookupError:
        try:
            os.kill(pid, 9)  # forked but not yet through setsid()
        except ProcessLookupError:
            pass

def read_all(fd):
    chunks, size = [], 0
    try:
        while chunk := os.read(fd, 65536):
            size += len(chunk)
            if size > MAX_SPEC:
                return None
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)

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
                spec = read_all(fds[0])
                if spec is None:
                    not_started(int(ident), fds[1], errno.E2BIG)
                else:
                    spawn(spec, fds[1])
                os.close(fds[1])
            elif op == b"open":
                spec = read_all(fds[0])
                if spec is None:  # its path is far over PATH_MAX: what open(2) would say
                    sock.send(b"%s E%d" % (ident, errno.ENAMETOOLONG))
                else:
                    open_file(spec)
            elif op == b"kill":
                target = int(ident)
                for pid, running_ident in list(running.items()):
                    if running_ident == target:
                        kill_group(pid)
finally:
    for pid in running:
        kill_group(pid)
"""
"""Source of the Python agent run inside the sandbox; ``argv[1]`` is the fd of its socket.

It imports only modules built into the interpreter or C extensions (``_socket``, ``_signal``,
``select``; no ``json``, ``socket``, ``signal``: their pure-Python imports took 13.6 of the
agent's 21 ms CPU start-up, paid once per prompt). The protocol, one message per datagram:
``ready`` (agent), ``run <id>`` with two descriptors: a file holding the command and the write
end of its output pipe (host), ``kill <id>`` (host), ``<id> <exit status>`` (agent). The command
file is ``id NUL cwd NUL argc NUL argv... NUL KEY=VALUE...``: none of these can hold a NUL
(``execve`` takes NUL-terminated strings), so the split is exact.

Files: ``open <id>`` with one descriptor, a file holding ``id NUL flags NUL mode NUL parents NUL
path`` (host); the agent opens the path itself, inside the sandbox (creating its parent folders
when ``parents`` is ``1``), and answers ``<id> F`` with the open descriptor attached, or ``<id>
E<errno>``. So a path is resolved by the kernel in the sandbox's own mount namespace, symlinks
included: there is no host-side check of a name that a command could swap before the open.

A request file over ``MAX_SPEC`` (8 MiB; ``execve`` takes at most 6 MiB of arguments) is not
read to its end: a ``run`` answers as a command that cannot start (``Argument list too long``),
an ``open`` with ``E<ENAMETOOLONG>``.

A command that cannot start (no program, fork failed) writes ``hermes sandbox: cannot run the
command: <reason>`` to its output and ends with 127; one whose folder cannot be entered writes
``cd: <folder>: <reason>`` and ends with 1. Commands start with SIGPIPE and SIGXFSZ at their
defaults, as plain subprocesses do. A request that does not parse (only a broken host sends
one) ends the agent: it kills its commands and exits 1, so the host ends every pending request.
At the socket's end (the host closed it, or died: the kernel closes its end) the agent kills its
commands' process groups and exits. The agent is the init of the sandbox's pid namespace
(bubblewrap ``--as-pid-1``, no separate reaper process), so the kernel then kills every other
process of the namespace, a command that left with ``setsid`` included: nothing of a sandbox
outlives its agent. As init it also reaps the orphans, and a command cannot kill it: the kernel
drops every signal from inside the namespace that the agent does not handle, SIGKILL included.

The native agent alone also brings up the outbound network on demand (``net-on-demand`` after
the socket's number; it then answers ``ready net-on-demand``): it stops its commands' ``socket``
calls of the network families until the host, asked once with ``net``, has attached the network
and answered ``net`` (see ``sandbox_agent.c``). This agent answers plain ``ready``, and the host
then attaches the network before the first command.

``sandbox_agent.c`` is the same program in C (the native agent); a change here goes there too,
and ``tests/hermes_core/environments/test_sandbox_agent.py`` runs every behaviour against both."""

NATIVE_AGENT_PATH = "/opt/hermes-batch/sandbox-agent"
"""Where a sandbox sees the native agent (the host file is bound there read-only).

Not its host path: that lies in the user's cache folder (``/root/...``, ``/home/...``), and a
bind at the same path would make ``/root`` or ``/home`` appear in the sandbox, with the host
user's name in it."""

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


def sandbox_argv(
    bwrap: str,
    home: str,
    tmp: str,
    network: str,
    extra_ro: list[str],
    resolv: str | None = None,
    agent_file: str | None = None,
) -> list[str]:
    """The bubblewrap options (up to and without the command) of a prompt's sandbox.

    Args:
        bwrap: path of ``bwrap``.
        home: the prompt's folder, bound writable at the same path (the commands' cwd and HOME).
        tmp: host folder bound writable at ``/tmp``.
        network: ``host`` keeps the host's network namespace (``--share-net``); ``outbound`` and
            ``none`` give the sandbox its own (``outbound`` then gets slirp4netns:
            :mod:`hermes_core.environments.outbound`).
        extra_ro: more host folders bound read-only at the same path.
        resolv: a host file shown as ``/etc/resolv.conf`` (the outbound network's name server), or None.
        agent_file: the host file of the native agent, bound read-only at :data:`NATIVE_AGENT_PATH`, or None.
    """
    argv = [bwrap, *_system_binds(network, resolv)]
    for folder in extra_ro:
        argv += ["--ro-bind", folder, folder]
    if agent_file:
        argv += ["--ro-bind", agent_file, NATIVE_AGENT_PATH]
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", tmp, "/tmp", "--bind", home, home]
    argv += ["--unshare-all", *(["--share-net"] if network == "host" else []), "--cap-drop", "ALL"]
    # The agent is the pid namespace's init: bubblewrap's own reaper would be one more process (and
    # fork) per prompt, and a thread every pivot_root on the machine walks (bench/results.md).
    argv += ["--new-session", "--as-pid-1"]
    return [*argv, "--chdir", home]


@functools.lru_cache(maxsize=8)
def _system_binds(network: str, resolv: str | None) -> tuple[str, ...]:
    """The options of :func:`sandbox_argv` that depend on this machine only, read once per process.

    ``/usr``, the top-level links or folders beside it, ``/etc`` and the name server file: a
    stat of each per sandbox was ~1 % of the flow process's GIL time at W = 1,024 (py-spy
    ``--gil``, bench/results.md). The machine's layout does not change under a run.
    """
    argv = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = "/" + name
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--ro-bind", "/etc", "/etc"]
    if resolv:
        target = "/etc/resolv.conf"
        if os.path.islink(target):  # systemd-resolved: a link to /run/..., which the sandbox lacks
            target = os.path.realpath(target)
        argv += ["--ro-bind", resolv, target]
    elif network == "host":
        host_resolv = os.path.realpath("/etc/resolv.conf")
        if not _within(host_resolv, "/etc") and os.path.isfile(host_resolv):
            argv += ["--ro-bind", host_resolv, host_resolv]  # systemd-resolved keeps it under /run
    return tuple(argv)


class SandboxProcess:
    """A command running in a :class:`BwrapSandbox`; the part of ``subprocess.Popen`` the local backend uses.

    Attributes:
        fd: host end (read) of the pipe holding the command's merged stdout and stderr.
        returncode: exit status once known (negative: killed by that signal), else None.
        exit_fd: an eventfd that becomes readable once the exit status is known, until
            :meth:`done` closes it (None then): a reader of :attr:`fd` waits on both instead of
            polling (a command that waits long, e.g. for its network, woke it 20 times a second).
    """

    def __init__(self, sandbox: BwrapSandbox, ident: int, fd: int):
        self._sandbox, self._ident, self.fd = sandbox, ident, fd
        self.returncode: int | None = None
        self._done = threading.Event()
        self._exit_lock = threading.Lock()
        self.exit_fd: int | None = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._done.set()
        with self._exit_lock:
            if self.exit_fd is not None:
                os.eventfd_write(self.exit_fd, 1)

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
        """Close :attr:`exit_fd`; nothing else to forget (:meth:`BwrapSandbox.close` kills the whole sandbox)."""
        with self._exit_lock:
            fd, self.exit_fd = self.exit_fd, None
        if fd is not None:
            os.close(fd)


class BwrapSandbox:
    """The long-lived bubblewrap sandbox of one prompt (see the module docstring).

    Args:
        bwrap: path of ``bwrap``.
        home: the prompt's folder (absolute, existing).
        tmp: host folder to show as ``/tmp`` (absolute, existing).
        env: environment of the agent and default of its commands.
        network: ``outbound`` (own namespace behind slirp4netns, internet only; with the native
            agent attached at a command's first network socket, with the Python agent before
            the first command), ``none`` (own namespace, loopback only) or ``host`` (the host's
            network namespace).
        extra_ro: more host folders to bind read-only at the same path.
        allowed_networks: with ``outbound``, networks to let through although they are private.

    Raises:
        SandboxError: ``HERMES_SANDBOX_AGENT=native`` and the native agent cannot be built
            (:func:`~hermes_core.environments.native_agent.native_agent`).
    """

    def __init__(
        self,
        bwrap: str,
        home: str,
        tmp: str,
        env: dict[str, str],
        network: str,
        extra_ro: list[str] = (),
        allowed_networks: tuple[str, ...] = (),
    ):
        native = native_agent()
        self._native = bool(native)  # only the native agent can bring the network up on demand
        if native:
            self._agent, binds = [NATIVE_AGENT_PATH], []
        else:
            python, binds = agent_interpreter()
            self._agent = [python, "-I", "-S", "-c", AGENT]
        resolv = _resolv_file() if network == "outbound" else None
        self._argv = sandbox_argv(bwrap, home, tmp, network, [*binds, *extra_ro], resolv, native)
        self._env = env
        self._network, self._allowed = network, tuple(allowed_networks)
        self._outbound: OutboundNetwork | None = None
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._pidfd: int | None = None
        self._info_r: int | None = None
        self._errors_r: int | None = None
        self._init_pid = 0
        self._lock = threading.Lock()
        self._network_lock = threading.Lock()  # one attach of the outbound network (the first command's)
        self._network_on_demand = False  # the agent asks for the network when a command needs it
        self._failure: str | None = None  # why the sandbox was closed, when it was not asked to
        self._procs: dict[int, SandboxProcess] = {}
        self._opens: dict[int, _PendingOpen] = {}
        self._next = 0
        self._ended = False
        self._closed = False

    def start(self) -> None:
        """Start bubblewrap and the agent; return once it is ready (at most 30 s).

        The outbound network is attached later, before the first command (:meth:`_attach_outbound`).

        Raises:
            SandboxError: bubblewrap could not build the sandbox (the message has its error output).
        """
        host, agent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()  # info_r stays open until close(): bubblewrap must never get SIGPIPE
        # bubblewrap's (and so its init's and the agent's) stderr: a pipe, never a host file. The
        # sandbox reaches it as /proc/1/fd/2; a file there would be a host file any command or
        # file tool could write without bound. Read for the reason of a failed start, then left
        # undrained (a writer blocks after 64 KiB) and open until close(), as info_r.
        errors_r, errors_w = os.pipe()
        argv = [*self._argv, "--info-fd", str(info_w), "--", *self._agent]
        on_demand = ["net-on-demand"] if self._network == "outbound" and self._native else []
        try:
            with self._lock:  # a concurrent close() waits for this, then kills what started
                if self._closed:
                    host.close()
                    os.close(info_r)
                    os.close(errors_r)
                    raise SandboxError("the sandbox was closed before it started")
                self._sock, self._info_r, self._errors_r = host, info_r, errors_r
                self._proc = subprocess.Popen(
                    [*argv, str(agent.fileno()), *on_demand],
                    env=self._env,
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors_w,
                    pass_fds=(agent.fileno(), info_w),
                    start_new_session=True,
                )
        except OSError as exc:
            self.close()
            raise SandboxError(f"cannot run bubblewrap: {exc}") from exc
        finally:
            agent.close()  # from now on only bubblewrap holds these: its exit is our EOF
            os.close(info_w)
            os.close(errors_w)
        answer = _recv(host) if readable(host, _START_TIMEOUT) else b""
        ready = answer in (b"ready", b"ready net-on-demand")
        self._network_on_demand = answer == b"ready net-on-demand"
        if ready:
            self._init_pid = _read_child_pid(info_r)
        if not ready:
            closed = self._closed
            with self._lock:  # read before close() closes it; a concurrent close() may have already
                fd = self._errors_r
                reason = _available(fd, 4096).decode("utf-8", "replace").strip() if fd is not None else ""
            self.close()
            if closed:
                raise SandboxError("the sandbox was closed while it started")
            reason = reason or "the agent did not start"
            raise SandboxError(f"bubblewrap cannot create a sandbox here: {reason[-500:]}")
        if self._init_pid:
            try:
                self._pidfd = os.pidfd_open(self._init_pid)
            except (AttributeError, OSError):
                self._pidfd = None
        try:
            _REPLIES.add(self)
        except RuntimeError as exc:  # no thread can start
            self.close()
            raise SandboxError(f"cannot read the sandbox's replies: {exc}") from exc
        if self._closed:  # close() ran while the agent was starting (it may not have known its init)
            self.close()
            raise SandboxError("the sandbox was closed while it started")

    def _attach_outbound(self) -> None:
        """Attach the outbound network when the sandbox first needs it; nothing uses a network that failed.

        Lazily, because only commands use the network, and few of them: a sandbox whose
        commands never open a network socket never pays for slirp4netns (~4-6 ms of machine CPU
        and ~40 ms of wall time per sandbox, bench/results.md). With the native agent, the
        first ``socket`` call of a network family asks for it (:meth:`_network_wanted`) and
        waits; with the Python agent it is attached before the first command. Either way no
        socket of a command exists before the network is up, so all of them see the same one.

        Raises:
            SandboxError: the network could not be set up (the sandbox is closed then), or the
                sandbox was closed meanwhile.
        """
        with self._network_lock:
            if self._outbound is not None:
                return
            if not self._init_pid:
                reason = "cannot set up the sandbox's network: bubblewrap did not report its init"
                self._fail(reason)
                raise SandboxError(reason)
            network = OutboundNetwork(self._init_pid, self._allowed)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._outbound = network
            if closed:
                raise SandboxError("the bubblewrap sandbox has ended")
            try:
                network.start()
            except SandboxError as exc:
                self._fail(str(exc))
                raise

    def spawn(self, argv: list[str], cwd: str, env: dict[str, str]) -> SandboxProcess:
        """Run ``argv`` in the sandbox in ``cwd`` with exactly ``env``; stdin is /dev/null.

        Raises:
            SandboxError: the sandbox is gone (closed, or its agent was killed).
            ValueError: an argument, the folder or a variable holds a NUL byte (as ``subprocess``).
        """
        ident = self._new_ident()
        command = command_spec(ident, argv, cwd, env)
        if self._network == "outbound" and not self._network_on_demand:
            self._attach_outbound()
        out_r, out_w = os.pipe()
        with self._lock:
            proc = self._procs[ident] = SandboxProcess(self, ident, out_r)
        try:
            if not self._send_spec(b"run %d" % ident, command, [out_w]):
                with self._lock:
                    self._procs.pop(ident, None)
                os.close(out_r)
                raise SandboxError("the bubblewrap sandbox has ended")
        finally:
            os.close(out_w)
        return proc

    def open(self, path: str, flags: int, mode: int = 0o666, *, parents: bool = False) -> int:
        """Open ``path`` inside the sandbox (as its commands see it) and return the descriptor here.

        The agent opens it in the sandbox's mount namespace, so the path (symlinks included) can
        only name what the sandbox can see, and a write outside its writable folders fails with
        EROFS / EACCES as it would for a command. The caller owns the returned descriptor and
        must check what it is (``os.fstat``): the sandbox is not trusted.

        Args:
            path: absolute path in the sandbox.
            flags: ``os.open`` flags (the caller adds ``O_NONBLOCK`` so a FIFO cannot block the agent).
            mode: permission bits of a created file.
            parents: create the missing parent folders first (like ``mkdir -p``).

        Raises:
            OSError: the open failed in the sandbox (errno as there: FileNotFoundError,
                PermissionError, IsADirectoryError ...).
            ValueError: the path holds a NUL byte.
            SandboxError: the sandbox is gone, or did not answer within 30 s.
        """
        encoded = os.fsencode(path)
        if b"\0" in encoded:
            raise ValueError("embedded null byte")
        ident = self._new_ident()
        spec = b"\0".join([b"%d" % ident, b"%d" % flags, b"%d" % mode, b"1" if parents else b"0", encoded])
        pending = _PendingOpen()
        with self._lock:
            self._opens[ident] = pending
        if not self._send_spec(b"open %d" % ident, spec, []):
            with self._lock:
                self._opens.pop(ident, None)
            raise SandboxError("the bubblewrap sandbox has ended")
        if not pending.done.wait(_START_TIMEOUT):
            with self._lock:
                self._opens.pop(ident, None)
            raise SandboxError("the sandbox did not answer a file request within 30 s")
        if pending.fd is not None:
            return pending.fd
        if pending.errno is None:
            raise SandboxError("the bubblewrap sandbox has ended")
        raise OSError(pending.errno, os.strerror(pending.errno), path)

    def _new_ident(self) -> int:
        with self._lock:
            self._next += 1
            return self._next

    def _send_spec(self, message: bytes, spec: bytes, fds: list[int]) -> bool:
        """Send a request whose details travel in a memory file (the first descriptor)."""
        memfd = os.memfd_create("hermes-spec", os.MFD_CLOEXEC)
        try:
            os.write(memfd, spec)
            os.lseek(memfd, 0, os.SEEK_SET)
            return self._send(message, [memfd, *fds])
        finally:
            os.close(memfd)

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

    def _read_replies(self) -> bool:
        """Take every reply the agent has sent (called by :class:`_ReplyLoop` when the socket is readable).

        Returns:
            False when the agent is gone (EOF, or the socket failed): the loop then stops reading
            and :meth:`_end_requests` ends every pending request. A reply that does not parse
            or that no request waits for is dropped; descriptors nobody took are closed.
        """
        while True:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(4096, socket.CMSG_SPACE(4), socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:
                data, ancillary = b"", []
            fds = _received_fds(ancillary)
            if data:
                self._deliver(data, fds)
            for fd in fds:  # what no request took
                os.close(fd)
            if not data:
                return False

    def _end_requests(self) -> None:
        """The agent is gone: every running command ends as killed, every pending open fails."""
        self._ended = True
        with self._lock:
            pending, self._procs = list(self._procs.values()), {}
            opens, self._opens = list(self._opens.values()), {}
        for proc in pending:
            proc._finish(-signal.SIGKILL)
        for request in opens:
            request.done.set()

    def _deliver(self, data: bytes, fds: list[int]) -> None:
        """Hand one reply to its request; a descriptor the request takes is removed from ``fds``."""
        if data == b"net":
            self._network_wanted()
            return
        ident_text, _, answer = data.partition(b" ")
        try:
            ident = int(ident_text)
        except ValueError:
            return
        if answer[:1] in (b"F", b"E"):
            with self._lock:
                request = self._opens.pop(ident, None)
            if request is None:
                return
            if answer == b"F" and len(fds) == 1:
                request.fd = fds.pop()
            elif answer[:1] == b"E" and answer[1:].isdigit():
                request.errno = int(answer[1:]) or 5
            request.done.set()
            return
        with self._lock:
            proc = self._procs.pop(ident, None)
        try:
            code = int(answer)
        except ValueError:
            code = -signal.SIGKILL
        if proc is not None:
            proc._finish(code)

    def ensure_network(self) -> None:
        """Bring the outbound network up now, as a command's first network socket would; no-op otherwise.

        Raises:
            SandboxError: the network could not be set up (the sandbox is closed then).
        """
        if self._network == "outbound":
            self._attach_outbound()

    def _network_wanted(self) -> None:
        """The agent asks for the network (a command's first network socket): attach it, off the reply thread."""
        if self._network != "outbound" or not self._network_on_demand:
            return  # only a broken agent asks unasked: its sockets keep waiting until close()
        # A thread per request, as many at once as sandboxes ask (each mostly waits ~40 ms for
        # slirp4netns), as when each prompt's own thread attached it: a pool of 32 made a wave of
        # 1,024 first sockets queue (bench/results.md). The thread ends with the start, so none
        # stays for every pivot_root on the machine to walk.
        try:
            threading.Thread(target=self._bring_network_up, name="hermes-network", daemon=True).start()
        except RuntimeError as exc:  # no thread can start: the waiting command must not wait for good
            # Not close(): this runs on the reply thread, under the lock close() takes. At EOF the
            # agent kills its commands and exits; the reply thread then ends their requests.
            self._failure = self._failure or f"cannot set up the sandbox's network: {exc}"
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _bring_network_up(self) -> None:
        """Attach the outbound network and tell the agent; on failure the sandbox is closed with the reason."""
        try:
            self._attach_outbound()
        except SandboxError:  # the sandbox is closed, with the reason (:meth:`_fail`)
            return
        except Exception as exc:  # a bug must not leave the command waiting for good
            logger.exception("setting up a sandbox's network failed")
            self._fail(f"cannot set up the sandbox's network: {exc}")
            return
        self._send(b"net")

    def _fail(self, reason: str) -> None:
        """Close the sandbox because of ``reason`` (kept for :attr:`failure`)."""
        if self._failure is None:
            self._failure = reason
        self.close()

    @property
    def failure(self) -> str | None:
        """Why the sandbox ended on its own (e.g. its network could not be set up), or None."""
        return self._failure

    @property
    def network_on_demand(self) -> bool:
        """True when the agent brings the outbound network up at a command's first network socket."""
        return self._network_on_demand

    @property
    def agent_pid(self) -> int:
        """Host pid of the agent, the init of the sandbox's pid namespace; 0 before :meth:`start`.

        Killing it ends the whole sandbox (the kernel kills every process of the namespace).
        """
        return self._init_pid

    @property
    def alive(self) -> bool:
        """True while the agent answers requests."""
        return not self._ended and self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Kill every process of the sandbox (SIGKILL to its pid namespace's init) and wait for bubblewrap.

        Idempotent and safe from another thread while :meth:`start` runs (then ``start`` raises
        SandboxError and nothing of the sandbox keeps running). The outbound network's
        slirp4netns is stopped too.
        """
        with self._lock:
            self._closed = self._ended = True
            proc, info_r, self._info_r = self._proc, self._info_r, None
            errors_r, self._errors_r = self._errors_r, None
            pidfd, self._pidfd = self._pidfd, None  # taken once: close() may run in two threads at once
            outbound, self._outbound = self._outbound, None
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
        if _REPLIES.remove(self):  # before the socket closes: its number may be reused at once
            self._end_requests()
        if outbound is not None:
            outbound.close()
        if proc is not None:
            try:
                wait_process(proc, 5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if info_r is not None:
            os.close(info_r)
        if errors_r is not None:
            os.close(errors_r)
        if self._sock is not None:
            self._sock.close()


class _ReplyLoop:
    """One thread that reads the replies of every running sandbox's agent (``epoll``).

    A thread per sandbox cost ~1,000 threads at W = 1,024: a thread start per prompt, and every
    ``pivot_root`` on the machine (bubblewrap's, slirp4netns') walks every thread
    (bench/results.md). Replies are a few bytes and handled at once, so one thread serves all.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._epoll: select.epoll | None = None
        self._sandboxes: dict[int, BwrapSandbox] = {}
        os.register_at_fork(after_in_child=self._forget)

    def add(self, sandbox: BwrapSandbox) -> None:
        """Read ``sandbox``'s socket from now on (the loop's thread starts with the first sandbox).

        A sandbox closed meanwhile is not added (its :meth:`BwrapSandbox.close` already ran
        :meth:`remove`). Raises RuntimeError when the thread cannot start (no thread left).
        """
        with self._lock:
            if sandbox._closed:
                return
            if self._epoll is None:
                epoll = select.epoll()
                try:
                    threading.Thread(
                        target=self._run, args=(epoll,), name="hermes-bwrap", daemon=True
                    ).start()
                except RuntimeError:
                    epoll.close()
                    raise
                self._epoll = epoll
            fd = sandbox._sock.fileno()
            self._sandboxes[fd] = sandbox
            self._epoll.register(fd, select.EPOLLIN)

    def remove(self, sandbox: BwrapSandbox) -> bool:
        """Stop reading ``sandbox``'s socket; True when it was read until now (then its requests are the caller's to end)."""
        with self._lock:
            sock = sandbox._sock
            fd = sock.fileno() if sock is not None else -1
            if fd < 0 or self._sandboxes.get(fd) is not sandbox:
                return False
            del self._sandboxes[fd]
            self._epoll.unregister(fd)
            return True

    def _run(self, epoll: select.epoll) -> None:
        while True:
            try:
                events = epoll.poll()
            except InterruptedError:
                continue
            for fd, _ in events:
                ended = None
                with self._lock:  # remove() cannot close a socket while it is read here
                    sandbox = self._sandboxes.get(fd)
                    if sandbox is not None and not _still_answering(sandbox):
                        ended = self._sandboxes.pop(fd)
                        epoll.unregister(fd)
                if ended is not None:
                    ended._end_requests()

    def _forget(self) -> None:
        """In a forked child: the parent's sandboxes and thread are not this process's."""
        self._lock = threading.Lock()
        self._epoll, self._sandboxes = None, {}


_REPLIES = _ReplyLoop()


def _still_answering(sandbox: BwrapSandbox) -> bool:
    """:meth:`BwrapSandbox._read_replies`, where a bug ends that sandbox's requests, not the loop of all."""
    try:
        return sandbox._read_replies()
    except Exception:
        logger.exception("reading a sandbox agent's replies failed; that sandbox's requests end")
        return False


class _PendingOpen:
    """An ``open`` request waiting for the agent: the descriptor, or the errno, once answered."""

    __slots__ = ("done", "fd", "errno")

    def __init__(self):
        self.done = threading.Event()
        self.fd: int | None = None
        self.errno: int | None = None


def _received_fds(ancillary) -> list[int]:
    """The descriptors of a ``recvmsg`` ancillary list (SCM_RIGHTS)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds += array.array("i", data[:usable]).tolist()
    return fds


@functools.lru_cache(maxsize=1)
def _resolv_file() -> str:
    """A host file (made once per process, removed at its exit) holding the outbound sandboxes' ``/etc/resolv.conf``."""
    folder = make_temp_dir("hermes-resolv-")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "resolv.conf")
    with open(path, "w") as fh:
        fh.write(resolv_conf())
    os.chmod(folder, 0o755)
    os.chmod(path, 0o644)
    return path


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


def _available(fd: int, limit: int) -> bytes:
    """What ``fd`` (a pipe) holds now, at most its last ``limit`` bytes, without waiting for more."""
    os.set_blocking(fd, False)
    kept = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        kept = (kept + chunk)[-limit:]
    return kept


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


__all__ = [
    "AGENT",
    "NATIVE_AGENT_PATH",
    "BwrapSandbox",
    "SandboxProcess",
    "agent_interpreter",
    "command_spec",
    "sandbox_argv",
]
