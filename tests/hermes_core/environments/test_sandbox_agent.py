"""The sandbox's two agents (native C and Python) behave the same; how the native one is built and cached.

The behaviour tests run once per agent (``HERMES_SANDBOX_AGENT=native`` / ``python``): commands,
exit statuses, timeouts and kills, files read, written and patched through the agent, a symlink
swapped under the file tools, NUL bytes and over-long requests, malformed requests. They need
``bwrap`` and, for the native agent, a C compiler (each skipped locally without it, failing in
CI: ``CI=true``).
"""

from __future__ import annotations

import array
import errno
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from hermes_core.environments import native_agent
from hermes_core.environments.bwrap import AGENT, NATIVE_AGENT_PATH, BwrapSandbox, command_spec
from hermes_core.environments.local import LocalEnvironment
from hermes_core.environments.poll import readable
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, ToolContext
from tests.conftest import host_pids_with, wait_until

ROOT = Path(__file__).resolve().parents[3]
IN_CI = os.environ.get("CI", "").lower() == "true"
COMPILER = shutil.which("cc") or shutil.which("gcc")
needs_bwrap = pytest.mark.skipif(
    not shutil.which("bwrap") and not IN_CI, reason="bubblewrap (bwrap) is not installed"
)
needs_compiler = pytest.mark.skipif(COMPILER is None and not IN_CI, reason="no C compiler (cc or gcc)")
ISOLATED = HermesSettings(local_isolation="bwrap", sandbox_network="none")


@pytest.fixture(params=["native", "python"])
def agent(request, monkeypatch) -> str:
    """Run the test with each agent; the in-process build answer is forgotten before and after."""
    if request.param == "native" and COMPILER is None and not IN_CI:
        pytest.skip("no C compiler (cc or gcc)")
    monkeypatch.setenv("HERMES_SANDBOX_AGENT", request.param)
    native_agent.clear_cache()
    yield request.param
    native_agent.clear_cache()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty ``XDG_CACHE_HOME``; yields the agent's cache folder in it (not made yet)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HERMES_SANDBOX_AGENT", raising=False)
    native_agent.clear_cache()
    yield tmp_path / "cache" / "hermes-batch"
    native_agent.clear_cache()


def wait_gone(needle: str, seconds: float = 5.0) -> list[int]:
    """Wait until no host process has ``needle`` in its command line; the pids left."""
    end = time.monotonic() + seconds
    while host_pids_with(needle) and time.monotonic() < end:
        time.sleep(0.05)
    return host_pids_with(needle)


def read_output(fd: int) -> bytes:
    """All of a sandbox command's output (until its pipe closes), closing our end."""
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


# -- behaviour, once per agent -----------------------------------------------------------


@needs_bwrap
def test_commands_give_their_output_and_exit_status(agent):
    with LocalEnvironment(settings=ISOLATED) as env:
        result = env.execute("echo out; echo err >&2; exit 3")
        assert (result.returncode, result.output) == (3, "out\nerr\n")
        assert env.execute("exit 0").returncode == 0
        assert env.execute("exit 255").returncode == 255
        assert env.execute("kill -TERM $$").returncode == -15  # as os.waitstatus_to_exitcode
        assert env.execute("kill -KILL $$").returncode == -9
        assert env.execute("cat; echo eof").output == "eof\n"  # stdin is /dev/null
        assert env.execute("yes | head -1; echo ${PIPESTATUS[@]}").output == "y\n141 0\n"  # SIGPIPE default
        long = "x" * 50_000  # a command file far larger than one read
        assert env.execute(f"echo {long} | wc -c").output == "50001\n"
        assert env.execute("echo $HOME; pwd").output == f"{env.home}\n{env.cwd}\n"


@needs_bwrap
def test_a_bad_cwd_and_a_missing_program(agent, tmp_path):
    with LocalEnvironment(settings=ISOLATED) as env:
        result = env.execute("pwd", cwd="missing")
        assert result.returncode == 1
        assert result.output == f"cd: {env.cwd}/missing: No such file or directory\n"
    home, tmp = (os.path.realpath(tmp_path / name) for name in ("home", "tmp"))
    os.mkdir(home), os.mkdir(tmp)
    sandbox = BwrapSandbox(shutil.which("bwrap"), home, tmp, {"PATH": "/usr/bin:/bin"}, network="none")
    try:
        sandbox.start()
        proc = sandbox.spawn(["/no/such/program"], home, {})
        output = read_output(proc.fd).decode()
        assert proc.wait(timeout=10) == 127
        assert output.startswith("hermes sandbox: cannot run the command: ")
        assert "No such file or directory" in output
    finally:
        sandbox.close()


@needs_bwrap
def test_a_timeout_kills_the_command_s_process_group(agent):
    marker = f"97.{time.monotonic_ns() % 10**6}"
    with LocalEnvironment(settings=ISOLATED) as env:
        began = time.monotonic()
        result = env.execute(f"echo started; sleep {marker} & sleep {marker}; wait", timeout=1)
        assert time.monotonic() - began < 5
        assert (result.returncode, result.timed_out, result.output) == (124, True, "started\n")
        assert wait_gone(f"sleep\0{marker}") == []  # the whole group, the background sleep too
        assert env.execute("echo still here").output == "still here\n"


@needs_bwrap
def test_a_killed_command_reports_minus_sigkill(agent, tmp_path):
    home, tmp = (os.path.realpath(tmp_path / name) for name in ("home", "tmp"))
    os.mkdir(home), os.mkdir(tmp)
    sandbox = BwrapSandbox(shutil.which("bwrap"), home, tmp, {"PATH": "/usr/bin:/bin"}, network="none")
    try:
        sandbox.start()
        proc = sandbox.spawn(["/bin/sh", "-c", "echo up; exec sleep 300"], home, {"PATH": "/usr/bin:/bin"})
        assert os.read(proc.fd, 100) == b"up\n"
        proc.kill()
        assert proc.wait(timeout=10) == -9
        proc.close_output()
    finally:
        sandbox.close()


@needs_bwrap
def test_background_processes_live_between_commands_and_die_at_close(agent):
    marker = f"42.{time.monotonic_ns() % 10**6}"
    env = LocalEnvironment(settings=ISOLATED)
    env.start()
    try:
        pid = env.execute(f"setsid sleep {marker} >/dev/null 2>&1 & echo $!").output.strip()
        time.sleep(0.2)
        assert env.execute(f"kill -0 {pid} && echo running").output == "running\n"
        assert len(host_pids_with(f"sleep\0{marker}")) == 1
    finally:
        env.close()
    assert wait_gone(f"sleep\0{marker}") == []
    assert host_pids_with(env._sandbox_tmp) == []


@needs_bwrap
def test_nothing_of_the_sandbox_outlives_a_killed_host(agent):
    """The run's process dies by SIGKILL (no close()): a command that left with setsid goes too, and
    with it bubblewrap (it lived on, holding the sandbox, while any such process did)."""
    marker = f"43.{time.monotonic_ns() % 10**6}"
    program = (
        "import sys\n"
        "from hermes_core.environments.local import LocalEnvironment\n"
        "from hermes_core.settings import HermesSettings\n"
        "env = LocalEnvironment(settings=HermesSettings(local_isolation='bwrap', sandbox_network='none'))\n"
        "env.start()\n"
        f"env.execute('setsid sleep {marker} >/dev/null 2>&1 &')\n"
        "print(env._sandbox_tmp, flush=True)\n"
        "sys.stdin.read()\n"
    )
    host = subprocess.Popen(
        [sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    sandbox_tmp = host.stdout.readline().strip()
    assert sandbox_tmp
    wait_until(lambda: len(host_pids_with(f"sleep\0{marker}")) == 1, 10, "the setsid'd sleep", 0.05)
    assert host_pids_with(sandbox_tmp)  # bubblewrap, with the sandbox's /tmp in its arguments
    host.kill()
    host.wait()
    assert wait_gone(f"sleep\0{marker}") == []
    assert wait_gone(sandbox_tmp) == []


def start_agent_outside_a_sandbox(
    agent: str, *options: str, ready: bytes = b"ready", **popen
) -> tuple[subprocess.Popen, socket.socket]:
    """The agent as a plain host process (no bubblewrap init to kill what it leaves), and our socket end."""
    host, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    program = (
        [native_agent.native_agent()] if agent == "native" else [sys.executable, "-I", "-S", "-c", AGENT]
    )
    proc = subprocess.Popen([*program, str(theirs.fileno()), *options], pass_fds=[theirs.fileno()], **popen)
    theirs.close()
    assert host.recv(100) == ready
    return proc, host


def send_request(host: socket.socket, message: bytes, spec: bytes, *fds: int) -> None:
    """One request whose details travel in a memory file, as BwrapSandbox sends it."""
    memfd = os.memfd_create("spec")
    os.write(memfd, spec)
    os.lseek(memfd, 0, os.SEEK_SET)
    host.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [memfd, *fds]))])
    os.close(memfd)


def test_the_protocol_and_eof_outside_a_sandbox(agent, tmp_path):
    marker = f"43.{time.monotonic_ns() % 10**6}"
    proc, host = start_agent_outside_a_sandbox(agent)
    try:
        out_r, out_w = os.pipe()
        env = {"PATH": "/usr/bin:/bin"}
        send_request(
            host, b"run 7", command_spec(7, ["/bin/sh", "-c", "echo $X; exit 5"], "/", {"X": "x=1"}), out_w
        )
        assert host.recv(100) == b"7 5"
        os.close(out_w)
        assert read_output(out_r) == b"x=1\n"
        path = str(tmp_path / "made" / "here.txt")
        send_request(
            host,
            b"open 8",
            b"\0".join([b"8", b"%d" % (os.O_WRONLY | os.O_CREAT), b"384", b"1", path.encode()]),
        )
        data, ancillary, _, _ = host.recvmsg(100, socket.CMSG_SPACE(4))
        assert data == b"8 F" and len(ancillary) == 1
        fd = array.array("i", ancillary[0][2])[0]
        os.write(fd, b"through the agent")
        os.close(fd)
        assert (
            Path(path).read_bytes() == b"through the agent" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        )
        send_request(host, b"open 9", b"\0".join([b"9", b"0", b"0", b"0", str(tmp_path / "none").encode()]))
        assert host.recv(100) == b"9 E2"
        out_r, out_w = os.pipe()
        send_request(host, b"run 10", command_spec(10, ["/bin/sleep", marker], "/", env), out_w)
        os.close(out_w)
        end = time.monotonic() + 5
        while not host_pids_with(f"sleep\0{marker}") and time.monotonic() < end:
            time.sleep(0.02)
        assert len(host_pids_with(f"sleep\0{marker}")) == 1
        host.shutdown(socket.SHUT_RDWR)  # EOF: the agent kills its commands, then exits
        assert proc.wait(timeout=10) == 0
        assert wait_gone(f"sleep\0{marker}") == []
        os.close(out_r)
    finally:
        host.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


SOCKETS = (
    "import socket; socket.socket(socket.AF_UNIX).close(); print('unix', flush=True); "
    "socket.socket(socket.AF_INET6).close(); print('inet6')"
)


def test_network_on_demand_a_network_socket_waits_until_the_host_says_net(agent):
    """The native agent stops a command's first network socket and asks once; the Python agent cannot (plain ready)."""
    native = agent == "native"
    proc, host = start_agent_outside_a_sandbox(
        agent, "net-on-demand", ready=b"ready net-on-demand" if native else b"ready"
    )
    try:
        out_r, out_w = os.pipe()
        send_request(host, b"run 7", command_spec(7, [sys.executable, "-c", SOCKETS], "/", {}), out_w)
        os.close(out_w)
        if native:
            assert host.recv(100) == b"net"  # asked at the AF_INET6 socket, not at the AF_UNIX one
            assert os.read(out_r, 100) == b"unix\n"
            assert not readable(host, 1.0)  # the command waits in socket(): no exit status comes
            host.send(b"net")
        assert host.recv(100) == b"7 0"
        assert read_output(out_r) == (b"inet6\n" if native else b"unix\ninet6\n")
        out_r, out_w = os.pipe()  # once up, a socket goes on at once and nothing is asked again
        send_request(host, b"run 8", command_spec(8, [sys.executable, "-c", SOCKETS], "/", {}), out_w)
        os.close(out_w)
        assert host.recv(100) == b"8 0"
        assert read_output(out_r) == b"unix\ninet6\n"
    finally:
        host.close()
        assert proc.wait(timeout=10) == 0


def test_a_command_s_exit_descriptor_wakes_its_reader_and_closes_when_done(agent, tmp_path):
    """``exit_fd`` turns readable when the exit status comes (so the reader need not poll), and ``done`` closes it."""
    sandbox = BwrapSandbox(
        shutil.which("bwrap"), str(tmp_path), str(tmp_path), {"PATH": "/usr/bin:/bin"}, "none"
    )
    sandbox.start()
    try:
        proc = sandbox.spawn(["/bin/sh", "-c", "sleep 0.3; exit 3"], str(tmp_path), {})
        exit_fd = proc.exit_fd
        assert not readable(exit_fd, 0.05) and proc.poll() is None
        assert readable(exit_fd, 10) and proc.poll() == 3
        os.close(proc.fd)
        proc.done()
        assert proc.exit_fd is None
        with pytest.raises(OSError):
            os.fstat(exit_fd)
    finally:
        sandbox.close()


MALFORMED = {
    "argc over the fields": (b"run 1", b"1\0/\05\0/bin/true"),
    "negative argc": (b"run 1", b"1\0/\0-1\0/bin/true"),
    "ident not a number": (b"run 1", b"x\0/\01\0/bin/true"),
    "variable without =": (b"run 1", b"1\0/\01\0/bin/true\0NOEQUALS"),
    "run without descriptors": (b"run 1", None),
    "NUL in a path": (b"open 1", b"1\00\00\00\0a\0b"),
    "flags not a number": (b"open 1", b"1\0x\00\00\0/"),
    "too few open fields": (b"open 1", b"1\00\00"),
    "kill of no number": (b"kill x", None),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_a_request_that_does_not_parse_ends_the_agent_with_status_1(agent, case):
    message, spec = MALFORMED[case]
    proc, host = start_agent_outside_a_sandbox(agent, stderr=subprocess.DEVNULL)
    try:
        out_r, out_w = os.pipe()
        if spec is None:
            host.send(message)
        else:
            send_request(host, message, spec, *([out_w] if message.startswith(b"run") else []))
        os.close(out_w)
        assert host.recv(100) == b""  # no reply: the agent is gone
        assert proc.wait(timeout=10) == 1
        assert read_output(out_r) == b""
    finally:
        host.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unknown_requests_and_kills_of_nothing_are_ignored(agent):
    proc, host = start_agent_outside_a_sandbox(agent)
    try:
        host.send(b"hello 1")
        host.send(b"kill 99")
        out_r, out_w = os.pipe()
        send_request(host, b"run 2", command_spec(2, ["/bin/sh", "-c", "echo ok"], "/", {}), out_w)
        os.close(out_w)
        assert host.recv(100) == b"2 0"
        assert read_output(out_r) == b"ok\n"
        host.shutdown(socket.SHUT_RDWR)
        assert proc.wait(timeout=10) == 0
    finally:
        host.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_bwrap
def test_files_are_read_and_written_inside_the_sandbox(agent):
    with LocalEnvironment(settings=ISOLATED) as env:
        env.write_file("deep/er/file.txt", b"made with its folders")  # mkdir -p
        assert env.read_file("deep/er/file.txt") == b"made with its folders"
        assert env.execute("cat deep/er/file.txt; [ -d deep/er ] && echo").output == "made with its folders\n"
        env.write_file("~/at-home.txt", b"home")
        assert env.read_file(f"{env.home}/at-home.txt") == b"home"
        env.write_file("deep/er/file.txt", b"shorter")  # truncated
        assert env.read_file("deep/er/file.txt") == b"shorter"
        env.write_file("/tmp/x//y/z.txt", b"tmp")
        assert env.execute("cat /tmp/x/y/z.txt").output == "tmp"
        env.write_file("empty.txt", b"")
        assert env.read_file("empty.txt") == b""


@needs_bwrap
def test_a_failed_open_gives_the_sandbox_s_errno(agent):
    with LocalEnvironment(settings=ISOLATED) as env:
        with pytest.raises(FileNotFoundError):
            env.read_file("missing.txt")
        with pytest.raises(FileNotFoundError):
            env.read_file("no/such/folder/file")
        with pytest.raises(OSError) as raised:
            env.write_file("/usr/hermes-x", b"no")
        assert raised.value.errno == errno.EROFS
        with pytest.raises(OSError) as raised:
            env.write_file("/usr/hermes-new-folder/x", b"no")  # its mkdir -p fails the same way
        assert raised.value.errno == errno.EROFS
        with pytest.raises(IsADirectoryError):
            env.read_file("/usr")
        env.write_file("plain.txt", b"a file")
        with pytest.raises(FileExistsError):
            env.write_file("plain.txt/below", b"no")  # as os.makedirs: the parent is a file
        with pytest.raises(NotADirectoryError):
            env.write_file("plain.txt/deeper/below", b"no")
        assert env.execute("ln -s nowhere dangling && echo made").output == "made\n"
        with pytest.raises(FileNotFoundError):
            env.write_file("dangling/deeper/below", b"no")  # os.makedirs passes over EEXIST of a parent
        with pytest.raises(FileNotFoundError):
            env.read_file("/root/anything")  # not in the sandbox


@needs_bwrap
def test_a_fifo_does_not_block_the_agent(agent):
    with LocalEnvironment(settings=ISOLATED) as env:
        assert env.execute("mkfifo pipe && echo made").output == "made\n"
        began = time.monotonic()
        with pytest.raises(OSError) as raised:
            env.read_file("pipe")
        assert raised.value.errno == errno.EINVAL  # opened without waiting for a writer, then refused
        with pytest.raises(OSError) as raised:
            env.write_file("pipe", b"x")
        assert raised.value.errno == errno.ENXIO  # no reader: the non-blocking open fails at once
        assert time.monotonic() - began < 5
        assert env.execute("echo alive").output == "alive\n"


def call(ctx: ToolContext, name: str, **arguments) -> dict:
    """A tool's result, through the registry as the agent loop calls it."""
    return json.loads(REGISTRY[name].invoke(ctx, arguments))


@needs_bwrap
def test_files_are_patched_through_the_agent(agent):
    with LocalEnvironment(settings=ISOLATED) as env:
        ctx = ToolContext(env=env, settings=ISOLATED)
        assert call(ctx, "write_file", path="src/a.py", content="x = 1\ny = 2\n")["bytes_written"] == 12
        patched = call(ctx, "patch", mode="replace", path="src/a.py", old_string="y = 2", new_string="y = 3")
        assert patched["success"] is True, patched
        assert env.execute("cat src/a.py").output == "x = 1\ny = 3\n"
        assert call(ctx, "read_file", path="src/a.py")["content"] == "     1|x = 1\n     2|y = 3"


@needs_bwrap
def test_a_symlink_swapped_under_the_file_tools_never_reaches_a_host_file(agent, tmp_path):
    """A background command flips ``w`` between its own file, a host file and another prompt's file.

    write_file, read_file and patch go through ``w`` for 4 s: each either reaches the prompt's
    own file or fails (the other two do not exist in the sandbox); neither host file is ever
    read or changed.
    """
    host_file = tmp_path / "host-secret.txt"
    host_file.write_text("HOST SECRET inside")
    with LocalEnvironment(settings=ISOLATED) as other, LocalEnvironment(settings=ISOLATED) as env:
        other.write_file("secret.txt", b"OTHER PROMPT inside")
        other_file = Path(other.home) / "secret.txt"
        ctx = ToolContext(env=env, settings=ISOLATED)
        env.write_file("inside.txt", b"inside")
        flipper = (
            "while :; do for t in inside.txt "
            f"{host_file} {other_file}; do ln -sfn $t w.new && mv -Tf w.new w; done; done"
        )
        env.execute(f"setsid sh -c '{flipper}' >/dev/null 2>&1 &")
        reads, refused, patched, end = set(), 0, 0, time.monotonic() + 4
        while time.monotonic() < end:
            try:
                env.write_file("w", b"inside")
            except OSError:
                refused += 1  # the link named a path the sandbox does not have
            try:
                reads.add(env.read_file("w"))
            except OSError:
                refused += 1
            result = call(ctx, "patch", mode="replace", path="w", old_string="inside", new_string="inside!")
            patched += result.get("success") is True
        assert other_file.read_bytes() == b"OTHER PROMPT inside"
    assert host_file.read_text() == "HOST SECRET inside"
    assert reads and all(read.rstrip(b"!") == b"inside" for read in reads), reads  # its own file only
    assert refused > 0 and patched > 0  # the race ran both ways


@needs_bwrap
def test_nul_bytes_and_over_long_requests_are_errors_and_the_agent_goes_on(agent):
    cannot_run = "hermes sandbox: cannot run the command: Argument list too long\n"
    with LocalEnvironment(settings=ISOLATED) as env:
        for attempt in (
            lambda: env.execute("echo a\0b"),
            lambda: env.execute("pwd", cwd="a\0b"),
            lambda: env.read_file("a\0b"),
            lambda: env.write_file("a\0b", b"x"),
        ):
            with pytest.raises(ValueError, match="null byte"):
                attempt()
        one_argument = env.execute("echo " + "x" * 200_000)  # over the kernel's 128 KiB per argument
        assert (one_argument.returncode, one_argument.output) == (127, cannot_run)
        request = env.execute("echo " + "x" * (9 << 20))  # a request file over the agent's 8 MiB
        assert (request.returncode, request.output) == (127, cannot_run)
        for path in ("x" * 300, "x" * 5000, "d/" + "x" * 300, "x" * (9 << 20)):  # a name, a path, a request
            for attempt in (lambda p: env.write_file(p, b"x"), env.read_file):
                with pytest.raises(OSError) as raised:
                    attempt(path)
                assert raised.value.errno == errno.ENAMETOOLONG, path[:10]
        assert env.execute("[ -d d ] && echo made").output == "made\n"  # as mkdir -p, before the open
        assert env.execute("echo alive").output == "alive\n"


@needs_bwrap
def test_the_sandbox_s_stderr_is_a_pipe_not_a_host_file(agent):
    """bubblewrap's stderr (its init's and the agent's fd 2) was a host temporary file: any command
    (``/proc/1/fd/2``) or file tool (``/proc/self/fd/2``, opened by the agent) could write it."""
    with LocalEnvironment(settings=ISOLATED) as env:
        links = env.execute("readlink /proc/1/fd/2 /proc/$PPID/fd/2").output.split()
        assert len(links) == 2 and all(link.startswith("pipe:[") for link in links), links
        for path in ("/proc/self/fd/2", "/proc/1/fd/2"):
            with pytest.raises(OSError) as raised:
                env.write_file(path, b"x")
            assert raised.value.errno == errno.EINVAL  # a FIFO: refused before any byte is written
            with pytest.raises(OSError) as raised:
                env.read_file(path)
            assert raised.value.errno == errno.EINVAL


@needs_bwrap
def test_many_sandboxes_share_two_threads_and_a_dead_agent_ends_only_its_own_requests(agent, tmp_path):
    """Replies of every sandbox are read by one thread, routes written by one more: the thread count
    does not grow with the number of sandboxes (a thread each cost ~1,000 threads at W = 1,024)."""
    path = {"PATH": "/usr/bin:/bin"}
    sandboxes = []
    before = threading.active_count()
    try:
        for i in range(12):
            home, tmp = tmp_path / f"home{i}", tmp_path / f"tmp{i}"
            home.mkdir(), tmp.mkdir()
            sandbox = BwrapSandbox(shutil.which("bwrap"), str(home), str(tmp), path, network="none")
            sandbox.start()
            sandboxes.append(sandbox)
        procs = [
            sb.spawn(["/bin/sh", "-c", f"sleep 0.3; echo {i}"], "/tmp", path)
            for i, sb in enumerate(sandboxes)
        ]
        assert threading.active_count() - before <= 2
        assert [read_output(p.fd) for p in procs] == [b"%d\n" % i for i in range(12)]
        assert [p.wait(timeout=10) for p in procs] == [0] * 12
        # a command cannot kill its agent, the pid namespace's init: the kernel drops the SIGKILL
        survivor = sandboxes[0].spawn(
            ["/bin/sh", "-c", "kill -9 $PPID 1; sleep 0.2; echo $PPID"], "/tmp", path
        )
        assert (read_output(survivor.fd), survivor.wait(timeout=10)) == (b"1\n", 0)
        assert sandboxes[0].alive
        # a dead agent (killed from the host) ends its own requests as killed; the others go on
        victim = sandboxes[0].spawn(["/bin/sh", "-c", "exec sleep 300"], "/tmp", path)
        os.kill(sandboxes[0].agent_pid, 9)
        assert victim.wait(timeout=10) == -9
        victim.close_output()
        assert not sandboxes[0].alive
        with pytest.raises(SandboxError):
            sandboxes[0].spawn(["/bin/true"], "/tmp", path)
        other = sandboxes[1].spawn(["/bin/sh", "-c", "echo still"], "/tmp", path)
        assert (read_output(other.fd), other.wait(timeout=10)) == (b"still\n", 0)
    finally:
        for sandbox in sandboxes:
            sandbox.close()


@needs_bwrap
def test_the_process_list_shows_the_agent_in_use(agent):
    with LocalEnvironment(settings=ISOLATED) as env:
        listing = env.execute("for p in /proc/[0-9]*; do tr '\\0\\n' '  ' < $p/cmdline; echo; done").output
        agent_line = env.execute("tr '\\0\\n' '  ' < /proc/$PPID/cmdline").output  # the shell's parent
    lines = [line.strip() for line in listing.splitlines() if line.strip()]
    assert agent_line.strip() in lines
    if agent == "native":
        assert agent_line.split() == [NATIVE_AGENT_PATH, agent_line.split()[1]], agent_line
        assert not any("python" in line for line in lines), lines
    else:
        assert os.path.basename(agent_line.split()[0]).startswith("python3"), agent_line
        assert agent_line.split()[1:4] == ["-I", "-S", "-c"], agent_line
        assert not any(NATIVE_AGENT_PATH in line for line in lines), lines


@needs_bwrap
def test_the_native_agent_s_folder_does_not_show_the_host_home(agent):
    with LocalEnvironment(settings=ISOLATED) as env:
        assert env.execute("ls /root /home 2>&1 | wc -l").output == "2\n"
        seen = env.execute(f"ls {native_agent.cache_folder()} 2>&1; ls /opt 2>&1").output
    assert "sandbox-agent-" not in seen


# -- the native agent's build ---------------------------------------------------------


@pytest.mark.parametrize("name, flags", native_agent.BUILDS, ids=["musl-gcc", "cc"])
def test_the_agent_compiles_without_warnings(tmp_path, name, flags):
    compiler = shutil.which(name)
    if compiler is None and not IN_CI:  # CI installs both (musl-tools, gcc)
        pytest.skip(f"{name} is not installed")
    done = subprocess.run(
        [compiler or name, *flags, "-Werror", "-o", str(tmp_path / "agent"), str(native_agent.SOURCE)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


def sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def elf_interpreter(path: str) -> str | None:
    """The program interpreter (dynamic loader) a 64-bit little-endian ELF file names, or None: static."""
    data = Path(path).read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path} is not a 64-bit little-endian ELF file"
    offset, size, count = (
        int.from_bytes(data[at : at + n], "little") for at, n in ((32, 8), (54, 2), (56, 2))
    )
    for header in range(offset, offset + size * count, size):
        if int.from_bytes(data[header : header + 4], "little") == 3:  # PT_INTERP
            start, length = (int.from_bytes(data[header + at : header + at + 8], "little") for at in (8, 32))
            return data[start : start + length].rstrip(b"\0").decode()
    return None


@needs_bwrap
@pytest.mark.skipif(
    shutil.which("musl-gcc") is None and not IN_CI, reason="musl-gcc (musl-tools) is not installed"
)
def test_with_musl_the_agent_is_static_so_no_loader_or_glibc_start_up_runs_per_prompt(fresh_cache):
    path = native_agent.native_agent()
    assert path is not None and Path(path).parent == fresh_cache
    assert elf_interpreter(path) is None
    assert elf_interpreter(sys.executable) is not None  # the check tells a dynamic program apart
    with LocalEnvironment(settings=ISOLATED) as env:
        seen = env.execute("sha256sum < /proc/1/exe; echo ran")
    assert seen.returncode == 0 and seen.output.split()[::2] == [sha256(path), "ran"]  # the sandbox's init


@needs_bwrap
@needs_compiler
def test_a_failing_musl_build_falls_back_to_the_system_compiler(fresh_cache, monkeypatch, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "musl-gcc").write_text("#!/bin/sh\necho 'musl-gcc: cannot find libc.a' >&2\nexit 1\n")
    (fake / "musl-gcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HERMES_SANDBOX_AGENT", "native")
    path = native_agent.native_agent()
    assert path is not None and elf_interpreter(path) is not None  # the system libc's build
    assert os.listdir(fresh_cache) == [Path(path).name]  # the failed build left nothing
    with LocalEnvironment(settings=ISOLATED) as env:
        seen = env.execute("sha256sum < /proc/1/exe; echo ran")
    assert seen.returncode == 0 and seen.output.split()[::2] == [sha256(path), "ran"]
    (fake / "cc").write_text("#!/bin/sh\necho 'cc: broken too' >&2\nexit 1\n")
    (fake / "cc").chmod(0o755)
    for name in os.listdir(fresh_cache):
        os.unlink(fresh_cache / name)
    native_agent.clear_cache()
    with pytest.raises(SandboxError, match="musl-gcc: cannot find libc.a.*cc: broken too"):
        native_agent.native_agent()


def test_the_source_ships_in_the_package():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "*.c" in data["hermes_core.environments"]
    assert native_agent.SOURCE.is_file()


@needs_compiler
def test_it_is_built_once_into_a_private_cache_named_by_the_source_hash(fresh_cache, monkeypatch, tmp_path):
    path = native_agent.native_agent()
    assert path is not None and Path(path).parent == fresh_cache
    assert Path(path).name.startswith("sandbox-agent-") and len(Path(path).name) == len("sandbox-agent-") + 16
    assert stat.S_IMODE(os.stat(fresh_cache).st_mode) == 0o700
    assert os.access(path, os.X_OK) and os.listdir(fresh_cache) == [Path(path).name]  # no temporary left
    built = os.stat(path).st_mtime_ns
    calls, build = [], native_agent.build_agent
    monkeypatch.setattr(native_agent, "build_agent", lambda *args: calls.append(args) or (None, "no"))
    assert native_agent.native_agent() == path and calls == []  # answered from memory
    monkeypatch.setattr(native_agent, "build_agent", build)
    native_agent.clear_cache()
    assert native_agent.native_agent() == path and os.stat(path).st_mtime_ns == built  # found, not rebuilt
    changed = tmp_path / "sandbox_agent.c"
    changed.write_bytes(native_agent.SOURCE.read_bytes() + b"/* changed */\n")
    monkeypatch.setattr(native_agent, "SOURCE", changed)
    native_agent.clear_cache()
    rebuilt = native_agent.native_agent()
    assert rebuilt not in (None, path) and sorted(os.listdir(fresh_cache)) == sorted(
        [Path(path).name, Path(rebuilt).name]
    )


@needs_compiler
def test_processes_building_at_once_all_get_a_whole_agent(fresh_cache):
    code = "from hermes_core.environments.native_agent import native_agent; print(native_agent())"
    env = {**os.environ, "HERMES_SANDBOX_AGENT": "native"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        for _ in range(4)
    ]
    paths = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(paths) == 1 and os.listdir(fresh_cache) == [Path(paths.pop()).name]
    agent = fresh_cache / os.listdir(fresh_cache)[0]
    ready = subprocess.run([str(agent), "x"], capture_output=True)  # a bad fd argument: exits 2 at once
    assert ready.returncode == 2


def test_the_python_agent_when_asked_or_when_the_native_one_cannot_be_built(
    fresh_cache, monkeypatch, tmp_path
):
    monkeypatch.setenv("HERMES_SANDBOX_AGENT", "python")
    assert native_agent.native_agent() is None and not fresh_cache.exists()  # not even built
    which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name: None if name in ("musl-gcc", "cc", "gcc") else which(name)
    )
    for mode in ("auto", "native"):
        monkeypatch.setenv("HERMES_SANDBOX_AGENT", mode)
        native_agent.clear_cache()
        if mode == "auto":
            assert native_agent.native_agent() is None
        else:
            with pytest.raises(SandboxError, match="no C compiler"):
                native_agent.native_agent()
    monkeypatch.setenv("HERMES_SANDBOX_AGENT", "fast")
    native_agent.clear_cache()
    with pytest.raises(SandboxError, match="(?s)invalid sandbox settings.*'auto', 'native' or 'python'"):
        native_agent.native_agent()
    with pytest.raises(SandboxError, match="must be auto, native or python, not 'fast'"):
        native_agent.native_agent("fast")


@needs_compiler
def test_a_failing_build_falls_back_or_fails_loudly(fresh_cache, monkeypatch, tmp_path):
    broken = tmp_path / "sandbox_agent.c"
    broken.write_text("int main(void) { return undeclared; }\n")
    monkeypatch.setattr(native_agent, "SOURCE", broken)
    assert native_agent.native_agent() is None
    assert os.listdir(fresh_cache) == []  # the temporary file is gone
    monkeypatch.setenv("HERMES_SANDBOX_AGENT", "native")
    native_agent.clear_cache()  # the setting is read once per process
    with pytest.raises(SandboxError, match="undeclared"):
        native_agent.native_agent()


def test_a_cache_folder_that_is_not_safely_ours_is_not_used(fresh_cache, monkeypatch):
    fresh_cache.mkdir(parents=True)
    fresh_cache.chmod(0o777)
    assert native_agent.native_agent() is None
    monkeypatch.setenv("HERMES_SANDBOX_AGENT", "native")
    native_agent.clear_cache()
    with pytest.raises(SandboxError, match="writable by other users"):
        native_agent.native_agent()
    fresh_cache.rmdir()
    fresh_cache.symlink_to(fresh_cache.parent)
    native_agent.clear_cache()
    with pytest.raises(SandboxError, match="is not a folder"):
        native_agent.native_agent()
    if os.geteuid() == 0:
        fresh_cache.unlink()
        fresh_cache.mkdir(mode=0o700)
        os.chown(fresh_cache, 12345, 12345)
        native_agent.clear_cache()
        with pytest.raises(SandboxError, match="another user"):
            native_agent.native_agent()


@needs_compiler
def test_a_planted_agent_file_is_not_run(fresh_cache, monkeypatch):
    path = native_agent.native_agent()
    os.chmod(path, 0o777)  # now anyone could have replaced it
    native_agent.clear_cache()
    assert native_agent.native_agent() is None
    monkeypatch.setenv("HERMES_SANDBOX_AGENT", "native")
    native_agent.clear_cache()
    with pytest.raises(SandboxError, match="writable by other users"):
        native_agent.native_agent()


FALLBACK_PROBE = """
from hermes_core.environments.local import LocalEnvironment
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings

settings = HermesSettings(local_isolation="bwrap", sandbox_network="none")
for _ in range(2):
    try:
        with LocalEnvironment(settings=settings) as env:
            print(env.execute("/usr/bin/tr '\\\\0\\\\n' '  ' < /proc/$PPID/cmdline").output)
    except SandboxError as exc:
        print("SandboxError:", exc)
"""


@needs_bwrap
def test_without_a_compiler_on_path_auto_uses_the_python_agent_and_native_fails(tmp_path):
    """A PATH with bwrap and bash but no cc or gcc, in a fresh process with an empty cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bwrap", "bash"):
        (bin_dir / name).symlink_to(shutil.which(name))
    env = {**os.environ, "PATH": str(bin_dir), "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def run(mode: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-c", FALLBACK_PROBE],
            env={**env, "HERMES_SANDBOX_AGENT": mode},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done

    auto = run("auto")
    commands = [line.split() for line in auto.stdout.splitlines() if line.strip()]
    assert len(commands) == 2, auto.stdout
    for command in commands:  # both prompts ran, each under the Python agent
        assert os.path.basename(command[0]).startswith("python3") and command[1:4] == ["-I", "-S", "-c"]
    told = [line for line in auto.stderr.splitlines() if "sandbox agent" in line]
    assert told == [
        "sandbox agent: using the Python one (about 14 ms more CPU per prompt): "
        "no C compiler (musl-gcc, cc or gcc) is installed"
    ]
    assert os.listdir(tmp_path / "cache" / "hermes-batch") == []  # nothing half-built left
    native = run("native")
    assert (
        native.stdout.splitlines()
        == [
            "SandboxError: HERMES_SANDBOX_AGENT=native but the native sandbox agent cannot be built: "
            "no C compiler (musl-gcc, cc or gcc) is installed"
        ]
        * 2
    )
