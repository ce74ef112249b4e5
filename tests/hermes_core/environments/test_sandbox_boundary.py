"""The local sandbox's boundary under attack: symlink races on the file tools, the network, a dataset's cwd.

Real bubblewrap, real slirp4netns, real network namespaces (made by the test with ``ip netns``
and veth, as root); skipped locally without them, failing in CI (CI=true).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from hermes_core.environments import native_agent
from hermes_core.environments.isolation import network_warning, outbound_problem
from hermes_core.environments.local import LocalEnvironment
from hermes_core.environments.outbound import BLOCKED_NETWORKS, host_addresses, sandbox_routes
from hermes_core.environments.workdir import cwd_problem, prepare_workdir
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, ToolContext
from tests.conftest import host_pids_with, process_alive

IN_CI = os.environ.get("CI", "").lower() == "true"
if not (shutil.which("bwrap") and shutil.which("slirp4netns")) and not IN_CI:
    pytest.skip("bubblewrap and slirp4netns are not installed", allow_module_level=True)

ISOLATED = HermesSettings(local_isolation="bwrap", sandbox_network="outbound")


def call(ctx: ToolContext, name: str, **arguments) -> dict:
    return json.loads(REGISTRY[name].invoke(ctx, arguments))


# -- file tools: no symlink race out of the sandbox -------------------------------------------------


# The symlink race against the file tools runs once per sandbox agent in test_sandbox_agent.py of this
# folder (a link flipped between the prompt's file, a host file and another prompt's file).


def test_the_file_tools_see_exactly_what_the_commands_see(tmp_path):
    (tmp_path / "outside.txt").write_text("host only")
    with LocalEnvironment(settings=ISOLATED) as env:
        ctx = ToolContext(env=env, settings=ISOLATED)
        env.execute(f"ln -s {tmp_path}/outside.txt link.txt; ln -s /etc/hostname etc-link")
        assert call(ctx, "read_file", path="link.txt")["error"] == "File not found: link.txt"
        assert "host only" not in json.dumps(call(ctx, "read_file", path=f"{tmp_path}/outside.txt"))
        assert call(ctx, "read_file", path="etc-link")["content"].startswith(
            "     1|"
        )  # read-only system: visible
        written = call(ctx, "write_file", path="/usr/lib/x.txt", content="no")
        assert "Read-only file system" in written["error"]
        assert call(ctx, "write_file", path="/tmp/t.txt", content="mine")["bytes_written"] == 4
        assert env.execute("cat /tmp/t.txt").output == "mine" and not os.path.exists("/tmp/t.txt")
        env.execute("mkfifo pipe")
        assert "not a regular file" in call(ctx, "read_file", path="pipe")["error"]
        assert call(ctx, "write_file", path="pipe", content="x")["error"].startswith("Could not write pipe")
        assert "is a directory" in call(ctx, "write_file", path="/tmp", content="x")["error"]


# -- bad tool arguments are tool errors -----------------------------------------------------------


@pytest.mark.parametrize(
    "settings", [ISOLATED, HermesSettings(local_isolation="none")], ids=["bwrap", "plain"]
)
def test_bad_paths_and_nul_bytes_are_tool_errors_not_prompt_failures(settings):
    with LocalEnvironment(settings=settings) as env:
        ctx = ToolContext(env=env, settings=settings)
        outside = call(ctx, "terminal", command="pwd", workdir="/no/such/folder")
        assert outside["exit_code"] == 1 and "No such file or directory" in outside["output"]
        assert "NUL" in call(ctx, "terminal", command="echo a\0b")["error"]
        assert "NUL" in call(ctx, "read_file", path="a\0b")["error"]
        assert "NUL" in call(ctx, "write_file", path="x\0y", content="z")["error"]
        assert "NUL" in call(ctx, "terminal", command="ls", workdir="a\0b")["error"]
        too_long = call(ctx, "terminal", command="echo " + "x" * 200_000)
        assert "too long" in too_long["error"]
        assert call(ctx, "terminal", command="echo fine")["output"] == "fine"


# -- network: outbound only -----------------------------------------------------------------------


@pytest.fixture
def host_listeners():
    """TCP servers on the host's 127.0.0.1 and on 0.0.0.0 (accepting in a thread); yields their ports."""
    servers = []
    for address in ("127.0.0.1", "0.0.0.0"):
        server = socket.socket()
        server.bind((address, 0))
        server.listen()
        servers.append(server)
    yield [server.getsockname()[1] for server in servers]
    for server in servers:
        server.close()


def connect_cmd(host: str, port: int) -> str:
    return (
        f"if timeout 3 bash -c 'echo hi > /dev/tcp/{host}/{port}' 2>/dev/null; "
        f"then echo {host}:reachable; else echo {host}:unreachable; fi"
    )


@pytest.fixture
def internet():
    """A stand-in for the internet: a network namespace behind a veth pair, serving HTTP on 198.51.100.2:8080."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        if IN_CI:
            pytest.fail("the network test needs root and iproute2 in CI")
        pytest.skip("needs root and iproute2 to make a network namespace")
    name = f"hbinet{uuid.uuid4().hex[:6]}"
    host_end, far_end = f"{name}a"[:15], f"{name}b"[:15]
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
    run("ip", "netns", "add", name)
    server = None
    try:
        run("ip", "link", "add", host_end, "type", "veth", "peer", "name", far_end)
        run("ip", "link", "set", far_end, "netns", name)
        run("ip", "addr", "add", "198.51.100.1/30", "dev", host_end)
        run("ip", "link", "set", host_end, "up")
        run("ip", "netns", "exec", name, "ip", "addr", "add", "198.51.100.2/30", "dev", far_end)
        run("ip", "netns", "exec", name, "ip", "link", "set", far_end, "up")
        run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, "python3", "-m", "http.server", "8080", "--bind", "198.51.100.2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                socket.create_connection(("198.51.100.2", 8080), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        yield "198.51.100.2:8080"
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_outbound_reaches_the_internet_but_nothing_of_this_machine(host_listeners, internet):
    assert outbound_problem() is None
    loopback_port, any_port = host_listeners
    targets = [("127.0.0.1", loopback_port), ("10.0.2.2", loopback_port), ("10.0.2.2", any_port)]
    targets += [(address, any_port) for address in host_addresses()]
    targets += [("169.254.169.254", 80), ("192.168.1.1", 80), ("10.1.2.3", 80), ("172.17.0.1", 80)]
    with LocalEnvironment(settings=ISOLATED) as env:
        out = env.execute("; ".join(connect_cmd(host, port) for host, port in targets), timeout=60).output
        for host, _port in targets:
            assert f"{host}:unreachable" in out, out
        page = env.execute(
            f"python3 -c \"import urllib.request as u; print(u.urlopen('http://{internet}/').status)\""
        )
        assert page.output.strip() == "200", page.output
        # The sandbox has its own socket table: the host's listeners are not in it (the sandbox's
        # own connection to the internet can still be there, e.g. in TIME_WAIT).
        table = env.execute("cat /proc/net/tcp /proc/net/tcp6").output.splitlines()
        local_ports = {
            int(row.split()[1].rsplit(":", 1)[1], 16) for row in table if row.split()[0].endswith(":")
        }
        assert local_ports.isdisjoint(host_listeners), table
        assert not [row for row in table if row.split()[3:4] == ["0A"]], table  # nothing listens


def test_allowed_networks_are_reachable_and_none_means_no_network(internet):
    allowed = ISOLATED.model_copy(update={"sandbox_allow_networks": ["198.51.100.0/30"]})
    assert ("198.51.100.0/30", "10.0.2.2") in sandbox_routes(("198.51.100.0/30",))
    assert {net for net, via in sandbox_routes() if via is None} >= set(BLOCKED_NETWORKS)
    host, port = internet.split(":")
    with LocalEnvironment(settings=allowed) as env:
        assert env.execute(connect_cmd(host, int(port))).output == f"{host}:reachable\n"
    offline = HermesSettings(local_isolation="bwrap", sandbox_network="none")
    with LocalEnvironment(settings=offline) as env:
        assert env.execute(connect_cmd(host, int(port))).output == f"{host}:unreachable\n"
        assert env.execute("awk -F: 'NR > 2 { print $1 }' /proc/net/dev").output.split() == ["lo"]


def test_a_run_without_slirp4netns_gets_no_network_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_no_slirp(tmp_path)}:/usr/sbin")
    from hermes_core.environments import isolation

    isolation._probe.cache_clear()
    try:
        warning = network_warning("local", ISOLATED)
        assert "NO network" in warning and "apt-get install slirp4netns" in warning
        with LocalEnvironment(settings=ISOLATED) as env:  # PATH is the test's: programs by full path
            devices = env.execute("/usr/bin/awk -F: 'NR > 2 { print $1 }' /proc/net/dev").output
            assert devices.split() == ["lo"]
    finally:
        isolation._probe.cache_clear()


def _no_slirp(folder: Path) -> str:
    """A folder holding links to every program of /usr/bin except slirp4netns (a PATH without it)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name in os.listdir("/usr/bin"):
        if name != "slirp4netns":
            (bin_dir / name).symlink_to(f"/usr/bin/{name}")
    return str(bin_dir)


def _interfaces(pid: int) -> list[str]:
    """Names of the network interfaces of ``pid``'s network namespace (its ``/proc/<pid>/net/dev``)."""
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return sorted(line.split(":", 1)[0].strip() for line in lines)


def _slirp_of(env: LocalEnvironment) -> list[int]:
    """Host pids of the slirp4netns of ``env``'s sandbox (its last two arguments: the agent's pid, ``tap0``)."""
    return host_pids_with(f"{env._sandbox.agent_pid}\0tap0")


def _socket_then_tap0(family: str, kind: str = "SOCK_STREAM") -> str:
    """A command that opens a socket (a failure to open it is printed: its errno), then counts ``tap0`` devices."""
    return (
        f'python3 -c "import socket\ntry: socket.socket(socket.{family}, socket.{kind}).close()\n'
        "except OSError as e: print(e.errno)\nprint(open('/proc/net/dev').read().count('tap0:'))\""
    )


def test_the_network_comes_up_at_the_first_network_socket_and_not_before():
    """File tools and commands that open no network socket never start slirp4netns; the first socket waits for it."""
    with LocalEnvironment(settings=ISOLATED) as env:
        env.write_file("notes.txt", b"no network needed")
        assert env.read_file("notes.txt") == b"no network needed"
        result = env.execute("cat notes.txt; echo; grep -c tap0: /proc/net/dev")
        assert result.output.split() == ["no", "network", "needed", "0"], result.output
        init = env._sandbox.agent_pid
        assert env._sandbox.network_on_demand
        assert _interfaces(init) == ["lo"]  # the sandbox runs, in a network namespace of its own
        assert _slirp_of(env) == []
        assert env.execute(_socket_then_tap0("AF_UNIX")).output == "0\n"  # a local socket is no network
        assert _slirp_of(env) == []
        # socket() returns only once the network is up: the same command then sees tap0
        assert env.execute(_socket_then_tap0("AF_INET")).output == "1\n"
        assert _interfaces(init) == ["lo", "tap0"]
        assert len(_slirp_of(env)) == 1
        routes = env.execute("ip -4 route show").output
        assert "default via 10.0.2.2 dev tap0" in routes and "unreachable 169.254.0.0/16" in routes, routes
        assert env.execute(_socket_then_tap0("AF_INET")).output == "1\n"
        assert len(_slirp_of(env)) == 1  # one network per sandbox, not per socket
        slirp = _slirp_of(env)
    assert not process_alive(slirp[0])  # and it ends with the sandbox


@pytest.mark.parametrize(
    ("family", "kind", "expected"),
    [
        ("AF_INET6", "SOCK_STREAM", "1\n"),
        ("AF_INET", "SOCK_DGRAM", "1\n"),
        ("AF_NETLINK", "SOCK_RAW", "1\n"),
        ("AF_PACKET", "SOCK_RAW", "1\n1\n"),  # EPERM (1): no capability, but the network came up
    ],
)
def test_each_network_family_brings_the_network_up(family, kind, expected):
    """IPv6, UDP (DNS), ``ip`` and getaddrinfo's interface check (netlink), ``ping`` see the network TCP sees."""
    with LocalEnvironment(settings=ISOLATED) as env:
        assert env.execute(_socket_then_tap0(family, kind)).output == expected
        assert len(_slirp_of(env)) == 1


def test_ip_alone_sees_the_network():
    with LocalEnvironment(settings=ISOLATED) as env:  # its first socket is netlink's
        assert env.execute("ip -o link show | grep -c tap0").output == "1\n"


def test_concurrent_first_sockets_all_wait_for_one_network():
    with LocalEnvironment(settings=ISOLATED) as env:
        command = _socket_then_tap0("AF_INET")
        result = env.execute(f"for i in 1 2 3 4 5 6; do {command} & done; wait")
        assert result.output.split() == ["1"] * 6, result.output
        assert len(_slirp_of(env)) == 1
        assert env.execute("ip -o link show tap0 | grep -c UP").output == "1\n"


def test_with_the_python_agent_the_network_is_up_before_the_first_command(monkeypatch):
    """The Python agent cannot stop socket calls: the host then attaches the network before any command runs."""
    monkeypatch.setenv("HERMES_SANDBOX_AGENT", "python")
    native_agent.clear_cache()
    try:
        with LocalEnvironment(settings=ISOLATED) as env:
            env.write_file("notes.txt", b"x")
            assert _slirp_of(env) == []  # file tools still never start it
            assert env.execute("grep -c tap0: /proc/net/dev").output == "1\n"
            assert not env._sandbox.network_on_demand
    finally:
        native_agent.clear_cache()


def test_the_outbound_probe_still_starts_slirp4netns_so_a_broken_one_means_no_network(tmp_path, monkeypatch):
    """The probe runs no network socket, so it brings the network up itself: a broken slirp4netns is found at the start."""
    from hermes_core.environments import isolation

    fake = tmp_path / "bin" / "slirp4netns"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'fake slirp4netns: not permitted here' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    isolation._probe.cache_clear()
    try:
        assert outbound_problem() == (
            "slirp4netns did not configure the sandbox's network: fake slirp4netns: not permitted here"
        )
        assert "NO network" in network_warning("local", ISOLATED)
    finally:
        isolation._probe.cache_clear()


def test_a_network_that_fails_on_demand_ends_the_sandbox_with_the_reason(tmp_path, monkeypatch):
    with LocalEnvironment(settings=ISOLATED) as env:
        assert env.execute("echo started").output == "started\n"  # the sandbox runs, without a network
        fake = tmp_path / "bin" / "slirp4netns"
        fake.parent.mkdir()
        fake.write_text("#!/bin/sh\necho 'fake slirp4netns: cannot open the tap device' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
        with pytest.raises(SandboxError) as raised:
            env.execute(_socket_then_tap0("AF_INET"), timeout=30)
        assert str(raised.value) == (
            "slirp4netns did not configure the sandbox's network: fake slirp4netns: cannot open the tap device"
        )
        assert not env._sandbox.alive


# -- the record's cwd ----------------------------------------------------------------------------


def test_cwd_rules(tmp_path):
    run_dir = tmp_path / "data" / "run"
    run_dir.mkdir(parents=True)
    repo = tmp_path / "repos" / "app"
    repo.mkdir(parents=True)
    roots = [str(tmp_path)]
    assert cwd_problem("src/app", roots=roots) is None
    assert cwd_problem("~/work", roots=roots) is None
    assert "leaves the prompt's folder" in cwd_problem("../../etc", roots=roots)
    assert cwd_problem(str(repo), roots=roots, refused=[run_dir]) is None
    for path, reason in [
        ("/", "root folder"),
        ("/proc", "system folder"),
        ("/proc/1", "system folder"),
        ("/sys/kernel", "system folder"),
        ("/root", "home folder"),
        ("/home", "home folder"),
        (os.path.expanduser("~"), "home folder"),
        (str(run_dir), "run or output folder"),
        (str(run_dir.parent), "run or output folder"),
        (str(tmp_path), "run or output folder"),  # it holds the output folder
    ]:
        problem = cwd_problem(path, roots=["/"], refused=[run_dir, run_dir.parent])
        assert problem and reason in problem, (path, problem)
    assert "outside the folders" in cwd_problem("/usr/share", roots=roots)
    assert "not an existing folder" in cwd_problem(str(tmp_path / "missing"), roots=roots)
    (repo / "big.bin").write_bytes(b"x" * 2048)
    assert "MB of files" in cwd_problem(str(repo), roots=roots, max_copy_bytes=1024)


def test_an_absolute_cwd_is_copied_in_and_the_original_never_changes(tmp_path):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "main.py").write_text("print('v1')\n")
    (repo / "link").symlink_to("/etc/hostname")
    os.mkfifo(repo / "fifo")
    with LocalEnvironment(cwd=str(repo), settings=ISOLATED) as env:
        assert env.cwd == os.path.join(env.home, "repo")
        out = env.execute(
            "python3 src/main.py; echo v2 > src/main.py; ls; readlink link; ls /proc/1/cwd 2>&1"
        )
        assert out.output.splitlines()[:4] == ["v1", "link", "src", "/etc/hostname"]
        assert env.execute(f"ls {repo} 2>&1").returncode != 0  # the original is not in the sandbox
    assert (repo / "src" / "main.py").read_text() == "print('v1')\n"
    assert not os.path.exists(env.home)


def test_a_refused_cwd_fails_the_sandbox_before_anything_runs():
    for cwd in ("/proc", "/", os.path.expanduser("~"), "../outside"):
        env = LocalEnvironment(cwd=cwd, settings=ISOLATED)
        with pytest.raises(SandboxError, match="cannot use the record's cwd"):
            env.start()
        env.close()


def test_prepare_workdir_makes_relative_folders_inside(tmp_path):
    assert prepare_workdir(str(tmp_path), "a/b") == str(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    assert prepare_workdir(str(tmp_path), None) == str(tmp_path)
    with pytest.raises(ValueError):
        prepare_workdir(str(tmp_path), "../x")


def test_closing_while_the_sandbox_starts_on_first_use_leaves_nothing(tmp_path):
    """The sandbox starts at the first command; a cancel may close the environment meanwhile."""
    for delay in (0.0, 0.01, 0.05, 0.2):
        env = LocalEnvironment(settings=ISOLATED)
        env.start()
        errors: list[BaseException] = []

        def first_command(env=env, errors=errors) -> None:
            try:
                env.execute("sleep 30")
            except SandboxError as exc:
                errors.append(exc)

        worker = threading.Thread(target=first_command)
        worker.start()
        time.sleep(delay)
        env.close(interrupted=True)
        worker.join(timeout=30)
        assert not worker.is_alive()
        assert not os.path.exists(env.home)
        sandbox = env._sandbox
        assert sandbox is None or not sandbox.alive
        outbound = getattr(sandbox, "_outbound", None)
        assert outbound is None or outbound._proc is None
