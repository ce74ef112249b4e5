"""The console of a run: in a pseudo-terminal one live display and no per-task lines; without one, summary lines."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import run_args

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PER_TASK = re.compile(r"Task run '[^']*' - Finished in state")


def _dataset(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"console prompt {i}"}) + "\n" for i in range(n)))
    return path


def test_in_a_terminal_one_live_display_and_no_per_task_lines(cli, mock_server):
    import pexpect

    dataset = _dataset(cli.cwd / "console.jsonl", 100)
    args = run_args(dataset, "console-tty", mock_server, "--num_workers=8", "--batch_size=10")
    env = {
        **os.environ,
        "PREFECT_API_URL": cli.api_url,
        "PREFECT_HOME": str(cli.cwd / "home"),
        "COLUMNS": "120",
    }
    child = pexpect.spawn(
        sys.executable, [str(REPO / "batch_runner.py"), *args], cwd=str(cli.cwd), env=env,
        encoding="utf-8", timeout=240, dimensions=(40, 120),
    )  # fmt: skip
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == 0, out[-3000:]
    assert not PER_TASK.search(out), "a per-task Prefect line reached the console"
    assert "run console-tty: 100 prompts" in out and "Tool usage - run console-tty" in out
    assert "100/100" in out and "\r" in out or "\x1b[" in out  # redrawn in place (cursor control)
    assert "run console-tty done in" in out


def test_without_a_terminal_summary_lines_and_failures_one_line_each(cli, mock_server):
    prompts = [f"plain console prompt {i}" for i in range(30)]
    prompts[7] = "[mock:error_5xx=50] plain console failing prompt"
    dataset = cli.cwd / "plain.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    proc = cli(*run_args(dataset, "console-plain", mock_server, "--retries=0", "--num_workers=4"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    err = proc.stderr
    assert not PER_TASK.search(err)
    assert "prompts 30/30 · failed 1" in err  # the one-line summary, not a bar
    failure_lines = [line for line in err.splitlines() if "failed after" in line]
    assert (
        len(failure_lines) == 1
        and "prompt 7 failed after 1 attempt(s): ModelError: HTTP 500" in failure_lines[0]
    )
    verbose = cli(*run_args(dataset, "console-verbose", mock_server, "--retries=0", "--verbose"))
    assert PER_TASK.search(verbose.stderr)  # --verbose shows Prefect's per-task lines
