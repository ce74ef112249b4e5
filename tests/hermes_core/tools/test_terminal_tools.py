"""Toolset terminal (terminal, process) through the registry against a real LocalEnvironment.

The tools run twice: on plain subprocesses and in the per-prompt bubblewrap sandbox (where
background processes must live on between commands). Pids are the environment's own (the
sandbox's pid namespace), so liveness is checked inside it with ``kill -0``.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from hermes_core.environments.local import LocalEnvironment
from hermes_core.exceptions import PromptTimeout
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, TOOLSETS, ToolContext
from hermes_core.tools.terminal import exit_code_meaning


@pytest.fixture(params=["none", "bwrap"])
def ctx(request):
    if request.param == "bwrap" and not shutil.which("bwrap") and os.environ.get("CI", "").lower() != "true":
        pytest.skip("bubblewrap (bwrap) is not installed")
    settings = HermesSettings(
        local_isolation=request.param, terminal_timeout=20, terminal_output_max_chars=10_000
    )
    with LocalEnvironment(settings=settings) as env:
        context = ToolContext(env=env, settings=settings)
        try:
            yield context
        finally:
            context.close()


def call(ctx: ToolContext, name: str, **arguments) -> dict:
    return json.loads(REGISTRY[name].invoke(ctx, arguments))


def alive(ctx: ToolContext, pid: int) -> bool:
    """True when ``pid`` runs in the prompt's environment (a zombie counts as dead)."""
    state = ctx.env.execute(f"cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null").output.strip()
    return state not in ("", "Z", "X")


def dies(ctx: ToolContext, pid: int, seconds: float = 3.0) -> bool:
    """Wait up to ``seconds`` for ``pid`` to end in the prompt's environment; True when it did."""
    end = time.monotonic() + seconds
    while alive(ctx, pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not alive(ctx, pid)


def test_toolset_and_schemas():
    assert TOOLSETS["terminal"] == ("terminal", "process")
    params = REGISTRY["terminal"].schema()["function"]["parameters"]
    assert params["required"] == ["command"]
    assert list(params["properties"]) == ["command", "background", "timeout", "workdir"]
    assert params["properties"]["timeout"] == {
        "minimum": 1,
        "type": "integer",
        "description": params["properties"]["timeout"]["description"],
    }
    assert params["properties"]["background"]["type"] == "boolean"
    process = REGISTRY["process"].schema()["function"]["parameters"]
    assert process["required"] == ["action"]
    assert process["properties"]["action"]["enum"] == [
        "list",
        "poll",
        "log",
        "wait",
        "kill",
        "write",
        "submit",
        "close",
    ]
    assert list(process["properties"]) == ["action", "session_id", "data", "timeout", "offset", "limit"]


def test_echo_output_and_exit_code(ctx):
    assert call(ctx, "terminal", command="echo hello") == {"output": "hello", "exit_code": 0, "error": None}


def test_non_zero_exit_is_not_an_error(ctx):
    assert call(ctx, "terminal", command="echo oops >&2; exit 3") == {
        "output": "oops",
        "exit_code": 3,
        "error": None,
    }
    assert call(ctx, "terminal", command="grep -q needle /dev/null") == {
        "output": "",
        "exit_code": 1,
        "error": None,
        "exit_code_meaning": "No matches found (not an error)",
    }
    assert "exit_code_meaning" not in call(ctx, "terminal", command="false")


def test_timeout_returns_124_error_and_footer(ctx):
    start = time.monotonic()
    result = call(ctx, "terminal", command="echo partial; sleep 30", timeout=1)
    assert time.monotonic() - start < 4
    assert result["exit_code"] == 124
    assert result["output"] == "partial\n\n[Command timed out after 1s]"
    assert "timed out" in result["error"]


def test_foreground_timeout_above_cap_is_refused(ctx):
    result = call(ctx, "terminal", command="sleep 1", timeout=601)
    assert list(result) == ["error"]
    assert "background=true" in result["error"]
    assert call(ctx, "terminal", command="true", timeout=0)["error"].startswith(
        "Invalid arguments for terminal"
    )


def test_output_is_bounded(ctx):
    result = call(ctx, "terminal", command="seq 1 200000")
    assert result["exit_code"] == 0
    assert "[OUTPUT TRUNCATED - " in result["output"]
    assert result["output"].startswith("1\n2\n3\n") and result["output"].endswith("199999\n200000")
    assert len(result["output"]) < 10_200


def test_workdir_and_ansi_stripping(ctx):
    ctx.env.execute("mkdir -p sub/inner")
    assert call(ctx, "terminal", command="pwd", workdir="sub/inner")["output"] == f"{ctx.env.cwd}/sub/inner"
    colored = call(ctx, "terminal", command=r"printf '\033[1;31mred\033[0m plain\033]0;title\007\n\n'")
    assert colored == {"output": "red plain", "exit_code": 0, "error": None}


def test_deadline_clamps_the_timeout(ctx):
    ctx.deadline = time.monotonic() + 2
    start = time.monotonic()
    result = call(ctx, "terminal", command="sleep 30")
    assert time.monotonic() - start < 4
    assert result["exit_code"] == 124 and result["error"]
    ctx.deadline = time.monotonic() - 1
    with pytest.raises(PromptTimeout):
        call(ctx, "terminal", command="echo never")


def test_background_poll_wait_log(ctx):
    started = call(ctx, "terminal", command="echo start; sleep 1; echo done; exit 3", background=True)
    assert started["output"] == "Background process started"
    assert started["exit_code"] == 0 and started["error"] is None
    sid = started["session_id"]
    assert sid.startswith("proc_") and len(sid) == 17 and int(sid[5:], 16) >= 0
    assert isinstance(started["pid"], int)

    poll = call(ctx, "process", action="poll", session_id=sid)
    assert poll["status"] == "running" and poll["pid"] == started["pid"]
    assert poll["command"] == "echo start; sleep 1; echo done; exit 3"
    assert "exit_code" not in poll

    waited = call(ctx, "process", action="wait", session_id=sid, timeout=10)
    assert waited == {
        "status": "exited",
        "session_id": sid,
        "command": "echo start; sleep 1; echo done; exit 3",
        "output": "start\ndone",
        "exit_code": 3,
    }
    poll = call(ctx, "process", action="poll", session_id=sid)
    assert poll["status"] == "exited" and poll["exit_code"] == 3 and poll["output_preview"] == "start\ndone"

    log = call(ctx, "process", action="log", session_id=sid)
    assert (log["output"], log["total_lines"], log["showing"]) == ("start\ndone", 2, "2 lines")
    log = call(ctx, "process", action="log", session_id=sid, offset=1, limit=1)
    assert (log["output"], log["total_lines"], log["showing"]) == ("done", 2, "1 lines")


def test_wait_times_out_then_kill_and_list(ctx):
    first = call(ctx, "terminal", command="sleep 30", background=True)
    second = call(ctx, "terminal", command="sleep 31", background=True, workdir=".")
    waited = call(ctx, "process", action="wait", session_id=first["session_id"], timeout=1)
    assert waited["status"] == "timeout" and waited["process_running"] is True and waited["timeout_note"]

    listed = call(ctx, "process", action="list")["processes"]
    assert [(p["session_id"], p["status"], p["command"]) for p in listed] == [
        (first["session_id"], "running", "sleep 30"),
        (second["session_id"], "running", "sleep 31"),
    ]

    killed = call(ctx, "process", action="kill", session_id=first["session_id"])
    assert killed["status"] == "killed"
    assert dies(ctx, first["pid"])
    poll = call(ctx, "process", action="poll", session_id=first["session_id"])
    assert poll["status"] == "exited" and poll["exit_code"] == 137
    assert call(ctx, "process", action="kill", session_id=first["session_id"])["status"] == "already_exited"
    assert alive(ctx, second["pid"])


def test_process_errors(ctx):
    assert call(ctx, "process", action="list") == {"processes": []}
    assert call(ctx, "process", action="poll") == {"error": "session_id is required for poll"}
    assert "Unknown session_id" in call(ctx, "process", action="log", session_id="proc_000000000000")["error"]
    sid = call(ctx, "terminal", command="sleep 30", background=True)["session_id"]
    assert "not supported" in call(ctx, "process", action="write", session_id=sid, data="x")["error"]
    assert call(ctx, "process", action="nope")["error"].startswith("Invalid arguments for process")


def test_cleanup_kills_leftovers(ctx):
    started = call(
        ctx,
        "terminal",
        command="sh -c 'echo $$ > gc.pid; exec sleep 30' & sleep 30; echo never",
        background=True,
    )
    end = time.monotonic() + 3
    while time.monotonic() < end and ctx.env.execute("cat gc.pid").returncode != 0:
        time.sleep(0.05)
    grandchild = int(ctx.env.read_file("gc.pid"))
    state_dir = ctx.state["process"].dir
    assert len(ctx.cleanups) == 1
    call(ctx, "terminal", command="sleep 30", background=True)
    assert len(ctx.cleanups) == 1  # one cleanup per prompt, not per process
    assert alive(ctx, started["pid"]) and alive(ctx, grandchild)
    ctx.close()
    assert dies(ctx, started["pid"]) and dies(ctx, grandchild)
    assert ctx.env.execute(f"test -e {state_dir}").returncode == 1


def test_the_exit_code_meaning_of_a_huge_command_reads_only_its_tail():
    """One 50 MB word: ``shlex.split`` on it is quadratic (0.14 / 0.59 / 3.1 s at 100 / 200 / 400 KB here)."""
    word = "a" * 50_000_000
    assert exit_code_meaning(f"{word}; grep x y", 1) == "No matches found (not an error)"
    assert exit_code_meaning(f"{word}; diff a b", 1) == "Files differ (not an error)"
    assert exit_code_meaning(f"grep {word}", 1) is None  # the cut segment's command name is unknown
    assert exit_code_meaning(f"grep {word[:100]}", 1) == "No matches found (not an error)"  # whole: known
