"""Toolset ``terminal``: ``terminal`` (run a command) and ``process`` (manage background commands).

Schemas and result shapes follow the Hermes agent's reference tools (README § Tools), revision
``terminal(command, background, timeout, workdir)`` and ``process``. Everything goes
through ``ctx.env.execute``, so the same code serves every backend. Background
commands run detached in their own session (``setsid``) with output in a log file
under a per-prompt state directory inside the environment
(``/tmp/hermes-bg-<12 hex>``); their table lives in ``ctx.state["process"]`` and one
cleanup registered in ``ctx.cleanups`` kills them all when the prompt ends.
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from hermes_core.environments import Environment
from hermes_core.exceptions import ToolError
from hermes_core.tools._registry import ToolContext, tool
from hermes_core.tools._shell import run_parts, strip_ansi

MAX_BACKGROUND = 64
"""Background processes one prompt may start."""
POLL_PREVIEW_CHARS = 1000
WAIT_OUTPUT_CHARS = 2000

# Informational non-zero exit codes: command name -> {code: meaning}.
_EXIT_MEANINGS: dict[str, dict[int, str]] = {
    **dict.fromkeys(("grep", "egrep", "fgrep", "rg", "ag", "ack"), {1: "No matches found (not an error)"}),
    **dict.fromkeys(("diff", "colordiff"), {1: "Files differ (not an error)"}),
    "find": {1: "Some directories could not be read (results may be partial)"},
    **dict.fromkeys(("test", "["), {1: "Condition is false (not an error)"}),
    "curl": {
        6: "Could not resolve host",
        7: "Failed to connect to host",
        22: "HTTP error response (4xx/5xx)",
        28: "Operation timed out",
    },
    "git": {1: "Non-zero status (often normal, e.g. differences found)"},
}
_PREFIX_WORDS = {"sudo", "env", "time", "command", "nice", "nohup", "!", "exec"}


MAX_COMMAND_BYTES = 128 * 1024 - 1
"""Longest command line (UTF-8 bytes): Linux refuses a longer single argument to ``execve``
(MAX_ARG_STRLEN, 128 KiB), and every backend runs the command as ``sh -c COMMAND``."""

_MEANING_TAIL = 4096
""":func:`exit_code_meaning` reads only this many characters at the end of a command (linear, bounded)."""


def exit_code_meaning(command: str, code: int) -> str | None:
    """Meaning of a non-error exit ``code`` of the last simple command of ``command``, or None.

    Looks only at the last :data:`_MEANING_TAIL` characters: host work on the model's input stays
    bounded whatever the command's length (``shlex.split`` is quadratic on some inputs).
    """
    tail = command[-_MEANING_TAIL:]
    segments = [s for s in re.split(r"\|\||&&|[|;\n&]", tail) if s.strip()]
    if len(command) > _MEANING_TAIL:
        segments = segments[1:]  # the first one may be cut: its command name is unknown
    if not segments:
        return None
    try:
        words = shlex.split(segments[-1])
    except ValueError:
        words = segments[-1].split()
    for word in words:
        if word in _PREFIX_WORDS or re.match(r"^\w+=", word):
            continue
        return _EXIT_MEANINGS.get(word.rsplit("/", 1)[-1], {}).get(code)
    return None


@tool("terminal")
def terminal(
    ctx: ToolContext,
    command: str,
    background: bool = False,
    timeout: Annotated[int, Field(ge=1)] | None = None,
    workdir: str | None = None,
) -> dict:
    """Run a shell command in the task's environment and return its output and exit code.

    Output is stdout and stderr merged, ANSI escapes removed, long output cut in the
    middle. A non-zero exit code is not an error by itself. Use background=true for
    servers and other long-running commands, then the process tool to poll, read the
    log, wait for or kill them.

    Args:
        command: the shell command line to execute.
        background: start the command as a tracked background process and return at once
            with a session_id for the process tool.
        timeout: seconds to wait for a foreground command (it returns as soon as the command
            ends); default {terminal_timeout}, maximum {terminal_max_foreground_timeout}. On timeout the command is killed and the
            exit code is 124.
        workdir: directory to run this one command in (default: the task's working directory).
    """
    settings = ctx.settings
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        raise ToolError(
            f"Command too long ({size} bytes; the limit is {MAX_COMMAND_BYTES}). Write long scripts "
            "to a file with write_file and run the file."
        )
    if background:
        return _start_background(ctx, command, workdir)
    if timeout is not None and timeout > settings.terminal_max_foreground_timeout:
        raise ToolError(
            f"Foreground timeout {timeout}s exceeds the maximum of {settings.terminal_max_foreground_timeout}s. "
            "Run long commands with background=true and check them with the process tool."
        )
    seconds = ctx.bound_timeout(timeout or settings.terminal_timeout)
    result = ctx.env.execute(command, cwd=workdir, timeout=seconds)
    output = strip_ansi(result.output).strip()
    if result.timed_out:
        shown = math.ceil(seconds)
        footer = f"[Command timed out after {shown}s]"
        return {
            "output": f"{output}\n\n{footer}" if output else footer,
            "exit_code": 124,
            "error": f"Command timed out after {shown}s; partial output kept. "
            "Use background=true for long-running commands.",
        }
    reply: dict = {"output": output, "exit_code": result.returncode, "error": None}
    meaning = exit_code_meaning(command, result.returncode) if result.returncode else None
    if meaning:
        reply["exit_code_meaning"] = meaning
    return reply


# -- background processes -----------------------------------------------------------


@dataclass
class _Proc:
    """One background process of a prompt (paths are inside the environment)."""

    session_id: str
    command: str
    pid: int
    log: str
    exit_file: str
    started: float


@dataclass
class _Table:
    """``ctx.state["process"]``: the prompt's state directory and its background processes."""

    dir: str
    procs: dict[str, _Proc]


def _table(ctx: ToolContext, create: bool = False) -> _Table | None:
    """The prompt's process table; created (with its one cleanup) on first background start."""
    table = ctx.state.get("process")
    if table is None and create:
        table = _Table(dir=f"/tmp/hermes-bg-{uuid.uuid4().hex[:12]}", procs={})
        ctx.state["process"] = table
        env = ctx.env
        ctx.cleanups.append(lambda: _kill_all(env, table))
    return table


def _kill_all(env: Environment, table: _Table) -> None:
    """Cleanup: SIGKILL every background process group of the prompt and remove the state directory."""
    pids = " ".join(str(p.pid) for p in table.procs.values())
    script = f"for p in {pids}; do kill -KILL -$p 2>/dev/null || kill -KILL $p 2>/dev/null; done; "
    env.execute(script + f"rm -rf {shlex.quote(table.dir)}", timeout=30)


def _start_background(ctx: ToolContext, command: str, workdir: str | None) -> dict:
    table = _table(ctx, create=True)
    if len(table.procs) >= MAX_BACKGROUND:
        raise ToolError(
            f"Too many background processes ({MAX_BACKGROUND}); kill some with the process tool first"
        )
    session_id = f"proc_{secrets.token_hex(6)}"
    log, exit_file = f"{table.dir}/{session_id}.log", f"{table.dir}/{session_id}.exit"
    q = shlex.quote
    # The detached wrapper runs the command with bash (else sh) and records its exit
    # status atomically; setsid gives it its own process group, killed as a whole.
    wrapper = '"$1" -c "$2"; echo $? > "$3.tmp"; mv "$3.tmp" "$3"'
    script = (
        f"mkdir -p {q(table.dir)} || exit 1; "
        "if command -v bash >/dev/null 2>&1; then _sh=bash; else _sh=sh; fi; "
        "if command -v setsid >/dev/null 2>&1; then _ss=setsid; else _ss=; fi; "
        f'$_ss sh -c {q(wrapper)} hermes-bg "$_sh" {q(command)} {q(exit_file)} '
        f"> {q(log)} 2>&1 < /dev/null & echo $!"
    )
    result = ctx.env.execute(script, cwd=workdir, timeout=ctx.bound_timeout(30))
    lines = result.output.strip().splitlines()
    if result.returncode != 0 or not lines or not lines[-1].isdigit():
        raise ToolError(f"Could not start background process: {strip_ansi(result.output).strip()[:500]}")
    proc = _Proc(session_id, command, int(lines[-1]), log, exit_file, time.monotonic())
    table.procs[session_id] = proc
    return {
        "output": "Background process started",
        "session_id": session_id,
        "pid": proc.pid,
        "exit_code": 0,
        "error": None,
    }


def _status_sh(proc: _Proc) -> str:
    """Shell snippet printing ``running`` or ``exited <code>`` (-1: gone without a recorded status)."""
    ex = shlex.quote(proc.exit_file)
    exited = f'echo "exited $(cat {ex})"'
    return (
        f"if [ -f {ex} ]; then {exited}; elif kill -0 {proc.pid} 2>/dev/null; then echo running; "
        f"elif [ -f {ex} ]; then {exited}; else echo 'exited -1'; fi"
    )


def _parse_status(line: str) -> tuple[str, int | None]:
    """``running`` / ``exited N`` -> (status, exit code or None)."""
    word, _, code = line.strip().partition(" ")
    if word != "exited":
        return "running", None
    try:
        return "exited", int(code)
    except ValueError:
        return "exited", -1


def _state(proc: _Proc, status: str, code: int | None) -> dict:
    """The fields every per-process result shares."""
    reply: dict = {"session_id": proc.session_id, "command": proc.command, "status": status, "pid": proc.pid}
    reply["uptime_seconds"] = round(time.monotonic() - proc.started, 1)
    if code is not None:
        reply["exit_code"] = code
    return reply


def _tail_sh(proc: _Proc, chars: int) -> str:
    return f"tail -c {chars} {shlex.quote(proc.log)} 2>/dev/null"


@tool("terminal")
def process(
    ctx: ToolContext,
    action: Literal["list", "poll", "log", "wait", "kill", "write", "submit", "close"],
    session_id: str | None = None,
    data: str = "",
    timeout: Annotated[int, Field(ge=1)] | None = None,
    offset: int | None = None,
    limit: Annotated[int, Field(ge=1)] = 200,
) -> dict:
    """Manage background processes started with terminal(background=true).

    Actions: list (all processes), poll (status and recent output), log (output lines),
    wait (block until the process exits or the timeout passes), kill (stop it and its
    children). write, submit and close (stdin) are not supported by this backend.

    Args:
        action: the operation: list, poll, log, wait, kill, write, submit or close.
        session_id: the session_id returned by terminal(background=true); required for every action but list.
        data: text for stdin (write sends it raw, submit adds Enter); not supported here.
        timeout: for wait: maximum seconds to wait (default and maximum {terminal_timeout}).
        offset: for log: 0-based line to start from (default: the last `limit` lines).
        limit: for log: maximum number of lines to return.
    """
    table = _table(ctx)
    if action == "list":
        return _list(ctx, table)
    if not session_id:
        raise ToolError(f"session_id is required for {action}")
    proc = table.procs.get(session_id) if table else None
    if proc is None:
        raise ToolError(f"Unknown session_id {session_id!r}; use process(action='list') to see the processes")
    if action in ("write", "submit", "close"):
        raise ToolError(
            f"process {action} is not supported: background processes have no stdin in this backend "
            "(run them with their input in the command line, e.g. a here-document or a pipe)"
        )
    if action == "poll":
        status_line, tail = run_parts(ctx, [_status_sh(proc), _tail_sh(proc, POLL_PREVIEW_CHARS)])
        status, code = _parse_status(status_line)
        return {**_state(proc, status, code), "output_preview": strip_ansi(tail)}
    if action == "log":
        log = shlex.quote(proc.log)
        window = (
            f"tail -n {limit} {log}" if offset is None else f"sed -n '{offset + 1},{offset + limit}p' {log}"
        )
        status_line, count, text = run_parts(
            ctx, [_status_sh(proc), f"wc -l < {log}", f"{window} 2>/dev/null"]
        )
        status, code = _parse_status(status_line)
        text = strip_ansi(text)
        shown = len(text.splitlines())
        reply = _state(proc, status, code)
        total = int(count.strip()) if count.strip().isdigit() else 0
        return {**reply, "output": text, "total_lines": total, "showing": f"{shown} lines"}
    if action == "wait":
        return _wait(ctx, proc, timeout)
    return _kill(ctx, proc)


def _list(ctx: ToolContext, table: _Table | None) -> dict:
    if not table or not table.procs:
        return {"processes": []}
    procs = list(table.procs.values())
    lines = run_parts(ctx, [_status_sh(p) for p in procs])
    listed = []
    for proc, line in zip(procs, lines, strict=True):
        status, code = _parse_status(line)
        entry = _state(proc, status, code)
        entry["command"] = proc.command[:200]
        listed.append(entry)
    return {"processes": listed}


def _wait(ctx: ToolContext, proc: _Proc, timeout: int | None) -> dict:
    clamp = ctx.settings.terminal_timeout
    requested = timeout or clamp
    seconds = ctx.bound_timeout(min(requested, clamp))
    ex = shlex.quote(proc.exit_file)
    loop = f"while [ ! -f {ex} ] && kill -0 {proc.pid} 2>/dev/null; do sleep 0.2 2>/dev/null || sleep 1; done"
    ctx.env.execute(loop, timeout=seconds)
    status_line, tail = run_parts(ctx, [_status_sh(proc), _tail_sh(proc, WAIT_OUTPUT_CHARS)])
    status, code = _parse_status(status_line)
    reply = {
        "status": status,
        "session_id": proc.session_id,
        "command": proc.command,
        "output": strip_ansi(tail),
    }
    if status == "exited":
        reply["exit_code"] = code
        return reply
    note = f"Waited {math.ceil(seconds)}s; the process is still running."
    if requested > seconds:
        note += f" (wait is capped at {math.ceil(seconds)}s; call wait again to keep waiting)"
    reply.update(status="timeout", timeout_note=note, process_running=True)
    return reply


def _kill(ctx: ToolContext, proc: _Proc) -> dict:
    ex = shlex.quote(proc.exit_file)
    script = (
        f"if [ -f {ex} ]; then echo already_exited; else "
        f"kill -KILL -{proc.pid} 2>/dev/null || kill -KILL {proc.pid} 2>/dev/null; "
        f"[ -f {ex} ] || echo 137 > {ex}; echo killed; fi"
    )
    result = ctx.env.execute(script, timeout=ctx.bound_timeout(30))
    status = "already_exited" if "already_exited" in result.output else "killed"
    return {"status": status, "session_id": proc.session_id, "command": proc.command}


__all__ = [
    "MAX_BACKGROUND",
    "MAX_COMMAND_BYTES",
    "POLL_PREVIEW_CHARS",
    "WAIT_OUTPUT_CHARS",
    "exit_code_meaning",
    "process",
    "terminal",
]
