"""Local backend with bubblewrap isolation: two prompts cannot read each other's folders or reach the network.

Needs ``bwrap`` (Debian ``bubblewrap``), which `.ci/docker-up.sh` installs; skipped locally without it,
failing in CI (CI=true).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from hermes_core.environments.local import LocalEnvironment
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, ToolContext
from tests.conftest import conversation_key

if not shutil.which("bwrap") and os.environ.get("CI", "").lower() != "true":
    pytest.skip("bubblewrap (bwrap) is not installed", allow_module_level=True)

ISOLATED = HermesSettings(local_isolation="bwrap", OPENROUTER_API_KEY="sk-must-not-leak")


@pytest.fixture
def listener():
    """A TCP server on the host's loopback; yields its port."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def connect_cmd(port: int) -> str:
    return f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo reachable || echo unreachable"


def test_two_isolated_prompts_cannot_see_each_other_or_the_network(listener):
    with LocalEnvironment(settings=ISOLATED) as a, LocalEnvironment(settings=ISOLATED) as b:
        a.write_file("secret.txt", b"A's secret")
        assert a.execute("cat secret.txt").output == "A's secret"
        peek = b.execute(f"cat {a.cwd}/secret.txt; ls {a.cwd}; ls /root /home /work 2>&1 | wc -l")
        assert "A's secret" not in peek.output
        assert f"cat: {a.cwd}/secret.txt: No such file or directory" in peek.output
        assert b.execute("ls /tmp").output.split() == [os.path.basename(b.cwd)]
        with pytest.raises(FileNotFoundError):
            b.read_file(f"{a.cwd}/secret.txt")  # the file methods see the sandbox's view too
        assert b.execute(connect_cmd(listener)).output == "unreachable\n"
        assert b.execute("awk -F: 'NR > 2 { print $1 }' /proc/net/dev").output.split() == ["lo"]
        env = b.execute("env").output
        assert "sk-must-not-leak" not in env and f"HOME={b.cwd}" in env
        assert "Read-only file system" in b.execute("touch /usr/x /etc/x").output
        with pytest.raises(PermissionError):
            b.write_file("/etc/hermes-x", b"no")
        b.write_file("/tmp/scratch.txt", b"mine")  # the prompt's private /tmp
        assert b.execute("cat /tmp/scratch.txt").output == "mine"
        assert not os.path.exists("/tmp/scratch.txt")
    assert not os.path.exists(a.cwd) and not os.path.exists(b.cwd)


def test_without_isolation_the_same_commands_do_reach_the_host(listener):
    with LocalEnvironment() as a, LocalEnvironment() as b:
        a.write_file("secret.txt", b"A's secret")
        assert b.execute(f"cat {a.cwd}/secret.txt").output == "A's secret"
        assert b.execute(connect_cmd(listener)).output == "reachable\n"


def test_tools_work_inside_the_bubblewrap_sandbox():
    with LocalEnvironment(settings=ISOLATED) as env:
        ctx = ToolContext(env=env, settings=ISOLATED)
        try:
            call = lambda name, **a: json.loads(REGISTRY[name].invoke(ctx, a))  # noqa: E731
            assert call("write_file", path="src/m.py", content="x = 1\n")["bytes_written"] == 6
            assert call("patch", path="src/m.py", old_string="x = 1", new_string="x = 2")["success"]
            assert call("search_files", pattern="x = [0-9]")["matches"][0]["content"] == "x = 2"
            assert call("terminal", command="python3 src/m.py && echo ok; pwd")["output"] == f"ok\n{env.cwd}"
        finally:
            ctx.close()


def test_isolation_bwrap_without_bwrap_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    env = LocalEnvironment(settings=ISOLATED)
    with pytest.raises(SandboxError, match="bwrap is not installed"):
        env.start()
    auto = LocalEnvironment(settings=HermesSettings(local_isolation="auto"))
    with auto:
        assert auto.execute("echo plain").output == "plain\n"  # auto falls back to plain subprocesses


def test_flow_run_with_bubblewrap_isolation(cli, mock_server, tmp_path):
    """Two prompts of one run on the local backend with bwrap: B can neither read A's folder nor connect out."""
    a_dir, b_dir = tmp_path / "prompt-a", tmp_path / "prompt-b"
    a_dir.mkdir()
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
        env={"HERMES_LOCAL_ISOLATION": "bwrap"},
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
