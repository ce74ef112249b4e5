"""Local backend in its per-prompt bubblewrap sandbox: what a prompt can see, reach and leave running.

Needs ``bwrap`` (Debian ``bubblewrap``), which `.ci/docker-up.sh` installs; skipped locally without it,
failing in CI (CI=true).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from hermes_core.environments import isolation, isolation_warning
from hermes_core.environments.isolation import bwrap_problem, container_runtime, isolation_refusal
from hermes_core.environments.local import LocalEnvironment
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, ToolContext
from tests.conftest import conversation_key, host_pids_with

if not shutil.which("bwrap") and os.environ.get("CI", "").lower() != "true":
    pytest.skip("bubblewrap (bwrap) is not installed", allow_module_level=True)

ISOLATED = HermesSettings(local_isolation="bwrap", OPENROUTER_API_KEY="sk-must-not-leak")
OFFLINE = ISOLATED.model_copy(update={"sandbox_network": "none"})


@pytest.fixture
def listener():
    """A TCP server on the host's loopback; yields its port."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def connect_cmd(port: int) -> str:
    return f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo reachable || echo unreachable"


def test_auto_is_the_default_and_isolates_when_bwrap_works():
    assert HermesSettings().local_isolation == "auto" and bwrap_problem() is None
    assert isolation_warning("local", HermesSettings()) is None
    with LocalEnvironment() as env:
        assert env.isolated
        assert env.execute("ls /root /home 2>&1 | wc -l; echo $HOME").output == f"2\n{env.cwd}\n"


def test_two_isolated_prompts_cannot_see_each_other_or_the_network(listener):
    with LocalEnvironment(settings=OFFLINE) as a, LocalEnvironment(settings=OFFLINE) as b:
        a.write_file("secret.txt", b"A's secret")
        assert a.execute("cat secret.txt").output == "A's secret"
        peek = b.execute(f"cat {a.cwd}/secret.txt; ls {a.cwd}; ls /root /home /work 2>&1 | wc -l")
        assert "A's secret" not in peek.output
        assert f"cat: {a.cwd}/secret.txt: No such file or directory" in peek.output
        # b's /tmp holds only the path to its own folder (in this process's scratch folder), not a's
        scratch = os.path.dirname(b.cwd)
        assert os.path.dirname(a.cwd) == scratch
        assert b.execute("ls /tmp").output.split() == [os.path.basename(scratch)]
        assert b.execute(f"ls {scratch}").output.split() == [os.path.basename(b.cwd)]
        with pytest.raises(FileNotFoundError):
            b.read_file(f"{a.cwd}/secret.txt")  # the file methods see the sandbox's view too
        assert b.execute(connect_cmd(listener)).output == "unreachable\n"
        assert b.execute("awk -F: 'NR > 2 { print $1 }' /proc/net/dev").output.split() == ["lo"]
        env = b.execute("env").output
        assert "sk-must-not-leak" not in env and f"HOME={b.cwd}" in env
        assert "Read-only file system" in b.execute("touch /usr/x /etc/x").output
        with pytest.raises(OSError, match="Read-only file system"):
            b.write_file("/etc/hermes-x", b"no")
        b.write_file("/tmp/scratch.txt", b"mine")  # the prompt's private /tmp
        assert b.execute("cat /tmp/scratch.txt").output == "mine"
        assert not os.path.exists("/tmp/scratch.txt")
    assert not os.path.exists(a.cwd) and not os.path.exists(b.cwd)


def test_without_isolation_the_same_commands_do_reach_the_host(listener):
    plain = HermesSettings(local_isolation="none")
    with LocalEnvironment(settings=plain) as a, LocalEnvironment(settings=plain) as b:
        a.write_file("secret.txt", b"A's secret")
        assert b.execute(f"cat {a.cwd}/secret.txt").output == "A's secret"
        assert b.execute(connect_cmd(listener)).output == "reachable\n"


def test_network_is_outbound_by_default_and_neither_mode_reaches_the_host_loopback(listener):
    """ "On" means the internet only (test_sandbox_boundary.py of this folder shows the outbound side): never
    the host's loopback."""
    assert HermesSettings().sandbox_network == "outbound"
    with LocalEnvironment(settings=ISOLATED) as online, LocalEnvironment(settings=OFFLINE) as offline:
        assert online.execute(connect_cmd(listener)).output == "unreachable\n"
        assert online.execute("awk -F: 'NR > 2 { print $1 }' /proc/net/dev").output.split() == ["lo", "tap0"]
        assert offline.execute(connect_cmd(listener)).output == "unreachable\n"
        assert offline.execute("awk -F: 'NR > 2 { print $1 }' /proc/net/dev").output.split() == ["lo"]
    host = HermesSettings(local_isolation="bwrap", sandbox_network="host")  # the explicit, unsafe opt-in
    with LocalEnvironment(settings=host) as shared:
        assert shared.execute(connect_cmd(listener)).output == "reachable\n"


LIST_FLOW_RUNS = """
import sys, urllib.request
request = urllib.request.Request(
    sys.argv[1] + "/flow_runs/filter", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
)
try:
    print("listed", urllib.request.urlopen(request, timeout=5).status)
except OSError as exc:
    print("blocked:", getattr(exc, "reason", exc))
"""


def test_the_runs_prefect_api_is_neither_visible_nor_reachable_from_a_sandbox(prefect_server):
    """The attack of issue 23: the port found in ``/proc/net/tcp``, then every flow run listed."""
    port = f":{urllib.parse.urlsplit(prefect_server).port:04X} "  # as /proc/net/tcp writes it
    assert port in Path("/proc/net/tcp").read_text()  # the host sees the server's listener
    probe = f"python3 -c {shlex.quote(LIST_FLOW_RUNS)} {prefect_server}"
    with LocalEnvironment(settings=ISOLATED) as online, LocalEnvironment(settings=OFFLINE) as offline:
        for env in (online, offline):
            assert port not in env.execute("cat /proc/net/tcp").output
            assert env.execute(probe).output == "blocked: [Errno 111] Connection refused\n"
    host = HermesSettings(local_isolation="bwrap", sandbox_network="host")  # the explicit, unsafe opt-in
    with LocalEnvironment(settings=host) as shared:  # the probe itself works where the API is reachable
        assert shared.execute(probe).output == "listed 200\n"


def test_the_sandbox_hides_the_host_processes_home_run_folder_and_docker_socket(tmp_path, monkeypatch):
    run_folder = tmp_path / "data" / "run-x"
    run_folder.mkdir(parents=True)
    (run_folder / "run.json").write_text("{}")
    monkeypatch.chdir(tmp_path)  # as the flow: the run folder is under the working directory
    with LocalEnvironment(settings=ISOLATED) as env:
        procs = env.execute(
            "for p in /proc/[0-9]*; do head -c 60 $p/cmdline | tr '\\0\\n' '  '; echo; done"
        ).output
        names = [os.path.basename(line.split(" ")[0]) for line in procs.splitlines() if line]
        agent = names[0] == "sandbox-agent" or names[0].startswith("python3")  # native or Python
        assert agent, procs  # pid 1, the init of the sandbox: its agent (no bubblewrap reaper)
        assert set(names[1:]) <= {"bash", "head", "tr"}, procs  # then only this command
        seen = env.execute(
            f"for p in /root /home /run /var/run /var/run/docker.sock {run_folder} data {tmp_path}; do "
            '[ -e "$p" ] && echo "visible $p"; done; echo checked'
        )
        assert seen.output == "checked\n"
        caps = env.execute("grep CapEff /proc/self/status").output.split()
        assert caps == ["CapEff:", "0000000000000000"]


def test_a_given_cwd_is_copied_in_never_bound(tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    (work / "in.txt").write_text("given\n")
    with LocalEnvironment(cwd=str(work), settings=ISOLATED) as env:
        copy = os.path.join(env.home, "project")
        out = env.execute("pwd; cat in.txt; echo made > out.txt; echo $HOME")
        assert out.output == f"{copy}\ngiven\n{env.home}\n"
        assert env.execute(f"ls {tmp_path} 2>&1").returncode != 0  # the host folder is not in the sandbox
    assert not (work / "out.txt").exists() and sorted(os.listdir(work)) == ["in.txt"]


def test_close_during_start_leaves_nothing_running():
    """A cancel may close the sandbox from another thread while start() builds it."""
    for delay in (0.0, 0.005, 0.02, 0.05, 0.1, 0.3):
        env = LocalEnvironment(settings=ISOLATED)
        errors: list[BaseException] = []

        def start(env=env, errors=errors) -> None:
            try:
                env.start()
            except SandboxError as exc:
                errors.append(exc)

        starter = threading.Thread(target=start)
        starter.start()
        time.sleep(delay)
        env.close(interrupted=True)
        starter.join(timeout=30)
        assert not starter.is_alive()
        assert not errors or "closed" in str(errors[0]), errors
        with pytest.raises(SandboxError):
            env.execute("true")
        with pytest.raises(SandboxError, match="closed"):
            env.start()
        assert env._sandbox_tmp is None or host_pids_with(env._sandbox_tmp) == []
        assert not env.cwd or not os.path.exists(env.cwd)


def test_tools_work_inside_the_bubblewrap_sandbox():
    with LocalEnvironment(settings=ISOLATED) as env:
        ctx = ToolContext(env=env, settings=ISOLATED)
        try:
            call = lambda name, **a: json.loads(REGISTRY[name].invoke(ctx, a))  # noqa: E731
            assert call("write_file", path="src/m.py", content="x = 1\n")["bytes_written"] == 6
            assert call("patch", path="src/m.py", old_string="x = 1", new_string="x = 2")["success"]
            assert call("search_files", pattern="x = [0-9]")["matches"][0]["content"] == "x = 2"
            assert call("terminal", command="python3 src/m.py && echo ok; pwd")["output"] == f"ok\n{env.cwd}"
            bg = call("terminal", command="echo started; sleep 30", background=True)
            time.sleep(0.5)
            polled = call("process", action="poll", session_id=bg["session_id"])
            assert polled["status"] == "running" and polled["output_preview"] == "started"
            assert call("process", action="kill", session_id=bg["session_id"])["status"] == "killed"
            assert call("process", action="poll", session_id=bg["session_id"])["status"] == "exited"
        finally:
            ctx.close()


def fake_bwrap(folder: Path, script: str) -> None:
    """Put an executable ``bwrap`` running ``script`` (sh) in ``folder``."""
    folder.mkdir(exist_ok=True)
    fake = folder / "bwrap"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)


def on_a_plain_host(monkeypatch) -> None:
    """Make this process look like a plain host's (this CI machine is itself a Docker container)."""
    monkeypatch.setattr(isolation, "CONTAINER_MARKERS", ())
    monkeypatch.delenv("container", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def test_without_a_working_bwrap_auto_falls_back_with_one_clear_warning(tmp_path, monkeypatch):
    on_a_plain_host(monkeypatch)
    fake_bwrap(tmp_path / "bin", 'echo "bwrap: No permissions to create a new namespace" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert "No permissions to create a new namespace" in bwrap_problem()
    assert isolation_refusal("local", HermesSettings(local_isolation="auto")) is None
    warning = isolation_warning("local", HermesSettings(local_isolation="auto"))
    assert "isolation is OFF" in warning and "No permissions" in warning
    assert "apt-get install bubblewrap" in warning and "--terminal_env=docker" in warning
    assert isolation_warning("local", HermesSettings(local_isolation="none")) is None
    assert isolation_warning("docker", HermesSettings(local_isolation="auto")) is None
    with LocalEnvironment(settings=HermesSettings(local_isolation="auto")) as plain:
        assert not plain.isolated and plain.execute("echo plain").output == "plain\n"
    required = LocalEnvironment(settings=HermesSettings(local_isolation="bwrap"))
    with pytest.raises(SandboxError, match="No permissions to create a new namespace"):
        required.start()
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert bwrap_problem() == "bwrap is not installed"
    assert "bwrap is not installed" in isolation_warning("local", HermesSettings())
    with pytest.raises(SandboxError, match="bwrap is not installed"):
        LocalEnvironment(settings=HermesSettings(local_isolation="bwrap")).start()


def test_in_a_container_without_a_working_bwrap_auto_refuses_and_recommends_docker(tmp_path, monkeypatch):
    on_a_plain_host(monkeypatch)
    marker = tmp_path / ".dockerenv"
    marker.touch()
    monkeypatch.setattr(isolation, "CONTAINER_MARKERS", ((str(marker), "docker"),))
    assert container_runtime() == "docker"
    assert (
        isolation_refusal("local", HermesSettings()) is None
    )  # bubblewrap works here: isolated as on a host
    fake_bwrap(tmp_path / "bin", 'echo "bwrap: No permissions to create a new namespace" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    refusal = isolation_refusal("local", HermesSettings(local_isolation="auto"))
    assert refusal.startswith("terminal_env=local cannot isolate commands in this docker container")
    assert "No permissions to create a new namespace" in refusal and "Use terminal_env=docker" in refusal
    assert isolation_warning("local", HermesSettings(local_isolation="auto")) is None  # refused, not warned
    assert isolation_refusal("local", HermesSettings(local_isolation="none")) is None  # the explicit opt-out
    assert isolation_refusal("docker", HermesSettings(local_isolation="auto")) is None
    monkeypatch.setattr(isolation, "CONTAINER_MARKERS", ())
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert container_runtime() == "kubernetes"
    assert "in this kubernetes container" in isolation_refusal("local", HermesSettings())


@pytest.mark.slow  # starts the command line in a subprocess
def test_flow_run_with_bubblewrap_isolation(cli, mock_server, tmp_path):
    """Two prompts of one run on the local backend with bwrap: B can neither read A's folder nor connect out."""
    a_dir, b_dir = tmp_path / "prompt-a", tmp_path / "prompt-b"
    a_dir.mkdir()
    b_dir.mkdir()
    (a_dir / "secret.txt").write_text("A-secret-value")
    port = int(mock_server.base_url.rsplit(":", 1)[1].split("/")[0])
    records = [
        {"prompt": "[mock:turns=1,command=cat secret.txt] prompt A reads its own file", "cwd": str(a_dir)},
        {
            "prompt": f"[mock:turns=1,command=cat {a_dir}/secret.txt; {connect_cmd(port)}] prompt B snoops",
            "cwd": str(b_dir),
        },
    ]
    dataset = tmp_path / "bwrap.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = cli(
        f"--dataset_file={dataset}",
        "--batch_size=2",
        "--run_name=bwrap",
        "--model=mock/scripted",
        f"--base_url={mock_server.base_url}",
        "--distribution=terminal_only",
        "--terminal_env=local",
        env={"HERMES_LOCAL_ISOLATION": "bwrap", "HERMES_SANDBOX_NETWORK": "false"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        json.loads(line)
        for line in (Path(cli.cwd) / "data/bwrap/trajectories.jsonl").read_text().splitlines()
    ]
    tool_text = [" ".join(t["value"] for t in row["conversations"] if t["from"] == "tool") for row in rows]
    assert "A-secret-value" in tool_text[0]
    assert "A-secret-value" not in tool_text[1] and "No such file or directory" in tool_text[1]
    assert "unreachable" in tool_text[1] and "reachable\\n" not in tool_text[1].replace("unreachable", "")
    assert mock_server.stats()["by_conversation"][conversation_key(records[1]["prompt"])] == 2


def test_a_sandbox_started_with_descriptors_above_1024_runs_commands():
    """With hundreds of prompts in flight the agent's socket has a descriptor >= 1024 (select cannot wait on it)."""
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        with LocalEnvironment(settings=ISOLATED) as env:
            assert env.isolated
            assert env.execute("echo hello; echo again").output == "hello\nagain\n"
            assert env.execute("echo twice").output == "twice\n"
    finally:
        for fd in filler:
            os.close(fd)


def test_commands_variables_and_folders_reach_the_sandbox_byte_for_byte(tmp_path, monkeypatch):
    """The agent's NUL-separated command file: '=' in values, empty values, newlines, non-ASCII names."""
    folder = tmp_path / "dir with spaces é"
    folder.mkdir()
    variables = {"A": "x=y=z", "EMPTY": "", "MULTI": "line 1\nline 2", "UNI": "ü ☃"}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    listed = {"sandbox_env": list(variables)}  # passed on by name (HERMES_SANDBOX_ENV)
    outputs = []
    for settings in (ISOLATED.model_copy(update=listed), HermesSettings(local_isolation="none", **listed)):
        with LocalEnvironment(cwd=str(folder), settings=settings) as env:
            assert env.isolated == (settings.local_isolation == "bwrap")
            out = env.execute('printf \'%s|\' "$A" "$EMPTY" "$MULTI" "$UNI" "$PWD"; printf \'a\\nb\'')
            assert env.cwd == os.path.join(env.home, folder.name)  # the folder's copy
            outputs.append(out.output.replace(env.cwd, "<cwd>"))
            with pytest.raises(ValueError, match="null byte"):
                env.execute("echo a\0b")  # refused before it runs, as subprocess refuses it
            assert env.execute("echo still alive").output == "still alive\n"
    assert outputs[0] == outputs[1] == "x=y=z||line 1\nline 2|ü ☃|<cwd>|a\nb"
