"""The console of a run: in a pseudo-terminal one live display (a bar line that always fits, a second line that
may be cut) and no per-task lines; without one, summary lines."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from flows.console import BAR_MIN_WIDTH, LiveProgress, progress_line
from flows.progress import RunProgress
from tests.conftest import run_args

REPO = Path(__file__).resolve().parents[2]
PER_TASK = re.compile(r"Task run '[^']*' - Finished in state")


def _dataset(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"console prompt {i}"}) + "\n" for i in range(n)))
    return path


@pytest.mark.slow
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


@pytest.mark.slow
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


class Screen:
    """A minimal terminal of ``columns`` cells a row, enough for rich's live display: printable text
    (wrapping at the right edge, as a terminal does), CR, LF, backspace, cursor up/down (CSI A/B) and
    erase in line (CSI K); other escape sequences (colours, cursor visibility) change nothing shown.
    Rows are never scrolled away. :attr:`shown` holds every row's text as it was just before it was
    erased (each frame of a live display is erased by the next), with whether it ran past the edge;
    :meth:`rows` the screen at the end.
    """

    TOKEN = re.compile(
        r"\x1b\[([0-9;?]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.|[\r\n\b]|[^\x1b\r\n\b]+"
    )

    def __init__(self, columns: int) -> None:
        self.columns = columns
        self.cells: list[list[str]] = [[]]
        self.row = self.col = 0
        self.wrapped: set[int] = set()  # rows whose text ran on to the next row
        self.shown: list[tuple[str, bool]] = []

    def feed(self, output: str) -> None:
        for match in self.TOKEN.finditer(output):
            token, (params, final) = match.group(0), match.group(1, 2)
            if final:
                n = int(params) if params.isdigit() else 1
                if final == "A":
                    self.row = max(0, self.row - n)
                elif final == "B":
                    self._down(n)
                elif final == "K":
                    self.shown.append((self.text(self.row), self.row in self.wrapped))
                    self.cells[self.row] = [] if params in ("2", "") else self.cells[self.row][: self.col]
                    self.wrapped.discard(self.row)
            elif token == "\r":
                self.col = 0
            elif token == "\n":
                self._down(1)
            elif token == "\b":
                self.col = max(0, self.col - 1)
            elif not token.startswith("\x1b"):
                for char in token:
                    if self.col >= self.columns:  # the terminal wraps what runs past the edge
                        self.wrapped.add(self.row)
                        self._down(1)
                        self.col = 0
                    line = self.cells[self.row]
                    line.extend(" " * (self.col + 1 - len(line)))
                    line[self.col] = char
                    self.col += 1

    def _down(self, n: int) -> None:
        self.row += n
        while len(self.cells) <= self.row:
            self.cells.append([])

    def text(self, row: int) -> str:
        return "".join(self.cells[row]).rstrip()

    def rows(self) -> list[str]:
        return [self.text(row) for row in range(len(self.cells))]


def test_the_screen_emulator_redraws_in_place_and_wraps_at_the_edge():
    screen = Screen(10)
    screen.feed("one\r\n\x1b[1mtwo\x1b[0m 2\r\x1b[2K\x1b[1A\x1b[2Kthree\r\nfour\r\n0123456789ab")
    assert screen.rows() == ["three", "four", "0123456789", "ab"]
    assert screen.shown == [("two 2", False), ("one", False)] and screen.wrapped == {2}


LIVE = re.compile(r"(?P<bar>[━╸╺]+)\s+(?P<done>\d+)/(?P<total>\d+) .*ETA (?P<eta>\d+:\d\d:\d\d)$")


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 120])
def test_in_a_pty_the_first_line_always_shows_bar_done_total_and_eta(cli, mock_server, columns):
    """The real ``hermes-batch run`` in a pseudo-terminal of ``columns`` (its window size, no COLUMNS)."""
    import pexpect

    dataset = _dataset(cli.cwd / "pty.jsonl", 16)
    run = f"console-pty-{columns}"
    args = run_args(dataset, run, mock_server, "--num_workers=2", model="mock/scripted?latency_ms=200")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env |= {"TERM": "xterm-256color", "PREFECT_API_URL": cli.api_url, "PREFECT_HOME": str(cli.cwd / "home")}
    command = shutil.which("hermes-batch")
    assert command, "the hermes-batch command is not installed (pip install -e .)"
    child = pexpect.spawn(
        command, ["run", *args], cwd=str(cli.cwd), env=env, encoding="utf-8", timeout=240,
        dimensions=(30, columns),
    )  # fmt: skip
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == 0, out[-3000:]
    screen = Screen(columns)
    screen.feed(out)
    frames = [(text, wrapped) for text, wrapped in screen.shown if LIVE.search(text)]
    assert frames, out[-3000:]
    assert not any(wrapped for _, wrapped in frames), "a line of the live display ran past the edge"
    running = [m for text, _ in frames if (m := LIVE.search(text)) and int(m["done"]) < int(m["total"])]
    assert any(m["total"] == "16" and m["eta"] != "0:00:00" for m in running), frames  # a real estimate
    assert all(text.startswith("prompts ") for text, _ in frames)
    assert any(re.search(r" · \d+\.\d\d/s · \d+:\d\d:\d\d elapsed · ETA ", text) for text, _ in frames)
    final = [row for row in screen.rows() if LIVE.search(row)]
    assert final and LIVE.search(final[-1])["done"] == "16", screen.rows()  # the last frame stays on screen
    details = [text for text, _ in screen.shown if text.startswith("failed 0 · discarded 0 · tokens ")]
    assert details and all(len(text) <= columns for text in details)
    if columns == 80:  # once the projection is known the run-wide figures do not fit: cut with an ellipsis
        assert any(len(text) == 80 and text.endswith("…") and "(projected" in text for text in details), (
            details
        )
    else:
        assert not any(text.endswith("…") for text in details), details
        assert any("(projected" in text and text.endswith("· limit 2 · 429s 0") for text in details), details


def _rendered(width: int, **progress: object) -> list[str]:
    """The live display's lines at ``width`` columns, after two updates 10 s apart (a fixed clock)."""
    clock = [0.0]
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    display = LiveProgress(console=console, get_time=lambda: clock[0])
    run = RunProgress(run_name="unit", total=123456, **progress)
    others = run.done  # failed and discarded prompts count as done
    run.completed = 61000 - others
    run.started = time.monotonic() - 1e6  # 0.06 prompts/s, whatever the test's own time
    display(run, None)
    clock[0], run.completed = 10.0, 61728 - others
    display(run, None)
    with console.capture() as capture:
        console.print(display.display)
    return capture.get().splitlines()


FULL = " 61728/123456 · 0.06/s · 0:00:10 elapsed · ETA 0:14:08"
"""The first line's figures: done/total, rate, elapsed, ETA (728 prompts in 10 s: 848 s left)."""


@pytest.mark.parametrize(
    ("width", "line"),
    [
        (200, r"prompts ━+╸? +" + re.escape(FULL)),
        (80, r"prompts ━+╸? +" + re.escape(FULL)),
        (60, r"prompts ━+╸? + 61728/123456 · ETA 0:14:08"),  # rate, then elapsed left out
        (40, r"━+╸? + 61728/123456 · ETA 0:14:08"),  # and the label
    ],
)
def test_the_first_line_fills_the_width_and_leaves_out_lesser_columns_first(width, line):
    first, second = _rendered(width)
    assert re.fullmatch(line, first), first
    assert len(first) == width
    bar = first.removeprefix("prompts ").split(" 61728/")[0]
    assert len(bar) >= BAR_MIN_WIDTH and bar.count("━") in (len(bar) // 2 - 1, len(bar) // 2)  # half done
    detail = "failed 0 · discarded 0 · tokens 0 · cost n/a"
    assert second == (detail if len(detail) <= width else detail[: width - 1] + "…")


def test_the_second_line_is_cut_with_an_ellipsis_and_never_pushes_the_first():
    meter = {"run_tokens": 987654321, "run_cost": 12.5, "projected_tokens": 1975308642, "projected_cost": 25.0,
             "max_cost_usd": 30.0, "limit": 16, "rate_limited": 3}  # fmt: skip
    wide = _rendered(200, failed=2, discarded=1, tokens=4242, cost=0.5, meter=lambda: meter)
    narrow = _rendered(80, failed=2, discarded=1, tokens=4242, cost=0.5, meter=lambda: meter)
    whole = (
        "failed 2 · discarded 1 · tokens 4242 · cost $0.5000 · run 987654321 tokens, $12.5000 of cap $30"
        " (projected 1975308642 tokens, $25.0000) · limit 16 · 429s 3"
    )
    assert wide[1] == whole
    assert narrow[1] == whole[:79] + "…"
    assert len(narrow) == 2 and re.fullmatch(r"prompts ━+╸? +" + re.escape(FULL), narrow[0])


def test_the_live_lines_show_the_pass_rate_and_the_skipped_samples():
    """Scored rows add ``pass passed/scored``; --stop_when_passed's skips add ``skipped n`` (both only when there are some)."""
    first, second = _rendered(200, scored=39, passed=30, skipped=2)
    assert second == "failed 0 · discarded 0 · skipped 2 · pass 30/39 · tokens 0 · cost n/a"
    run = RunProgress(run_name="unit", total=10, completed=4, scored=4, passed=3)
    assert progress_line(run).startswith("prompts 4/10 · failed 0 · discarded 0 · pass 3/4 · ")
