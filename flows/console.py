"""Terminal output of the command line: the live progress display and the end-of-run summary table (rich).

While a run goes, the console shows one live display (on a terminal: a bar that redraws in
place; without one, e.g. a CI log or a worker's log file: a summary line every
:data:`SUMMARY_SECONDS`) and, above it, only the lines that matter: the run's start and end,
warnings and errors (one per failed prompt). Prefect's own console lines, one per task run,
are kept off the console (they still go to the Prefect API and its UI); ``--verbose`` shows
them, and the tool-call previews, above the display.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table
from rich.text import Text

from flows.prefect_adapter import TASK_RUN_LOGGERS, run_log_names
from flows.progress import LISTENERS, RunProgress, meter_text
from hermes_core.compression import describe_compression
from hermes_core.runfolder.folder import RunFolder
from hermes_core.scoring import describe_pass_at_k, describe_scores
from tasks.statistics import describe_stopped

_console = Console(stderr=True)

SUMMARY_SECONDS = 10.0
"""Without a terminal, how often the one-line progress summary is printed."""


def _spend_text(progress: RunProgress) -> str:
    """``tokens 12345 · cost $0.0123``, then the run-wide figures (:func:`flows.progress.meter_text`)."""
    cost = "n/a" if progress.cost is None else f"${progress.cost:.4f}"
    text = f"tokens {progress.tokens} · cost {cost}"
    return text + (f" · {meter_text(figures)}" if (figures := progress.figures()) else "")


def _outcomes_text(progress: RunProgress) -> str:
    """``failed 1 · discarded 0``, then ``· skipped 2`` (``--stop_when_passed``) and ``· pass 7/10`` when there are some."""
    text = f"failed {progress.failed} · discarded {progress.discarded}"
    if progress.skipped:
        text += f" · skipped {progress.skipped}"
    return text + (f" · {progress.pass_text()}" if progress.scored else "")


def progress_line(progress: RunProgress) -> str:
    """``prompts 40/100 · failed 1 · discarded 0 · pass 30/39 · 3.20/s · ETA 19 s · tokens 12345 · cost
    $0.0123``, then the run-wide figures (:func:`flows.progress.meter_text`: spend, projection, request
    limit, 429s); ``skipped`` and ``pass`` only when there are some."""
    left = progress.total - progress.done
    eta = f"{left / progress.rate:.0f} s" if progress.rate > 0 and left else "-"
    return (
        f"prompts {progress.done}/{progress.total} · {_outcomes_text(progress)}"
        f" · {progress.rate:.2f}/s · ETA {eta} · {_spend_text(progress)}"
    )


def detail_line(progress: RunProgress) -> str:
    """The live display's second line: ``failed 1 · discarded 0 · pass 30/39 · tokens 12345 · cost $0.0123``,
    then the run-wide figures (spend, cap, projection, request limit, 429s)."""
    return f"{_outcomes_text(progress)} · {_spend_text(progress)}"


BAR_MIN_WIDTH = 10
"""Fewest cells the bar keeps before the live display leaves out its lesser columns (rate, elapsed)."""


class TwoLineProgress(Progress):
    """A rich :class:`~rich.progress.Progress` drawn as two lines per task, the first fitting the terminal.

    Rich itself shrinks every column of a line that is too wide (``4567/123…``, ``-:--:…``); here the
    first line leaves out whole columns instead. The bar (``bar``, a full-width
    :class:`~rich.progress.BarColumn`) takes the room the other columns leave. When even a
    :data:`BAR_MIN_WIDTH` bar does not fit in the width the line is drawn in, the groups of
    ``optional`` columns are left out, first group first, until it does, so the columns that are
    not optional (e.g. done/total and ETA) stay whole (on a terminal too narrow for those alone,
    rich shrinks them). The second line is the task's ``detail`` field, cut with an ellipsis.

    Args:
        columns: the first line's columns, left to right.
        bar: the column among ``columns`` that shrinks.
        optional: groups of columns (among ``columns``), in the order they are left out.
        **kwargs: passed to :class:`~rich.progress.Progress` (``expand`` is always True).
    """

    def __init__(
        self,
        *columns: ProgressColumn,
        bar: ProgressColumn,
        optional: Sequence[Sequence[ProgressColumn]] = (),
        **kwargs: Any,
    ) -> None:
        self._bar = bar  # set first: rich's constructor renders the display once
        self._optional = [list(group) for group in optional]
        super().__init__(*columns, expand=True, **kwargs)

    def get_renderables(self) -> Iterable[RenderableType]:
        """The columns' line, then each visible task's ``detail`` line (if any)."""
        tasks = [task for task in self.tasks if task.visible]
        yield _Fitting(self, tasks)
        for task in tasks:
            if detail := task.fields.get("detail"):
                yield Text(str(detail), no_wrap=True, overflow="ellipsis", style="dim")

    def fitting_table(self, tasks: Sequence[Task], console: Console, width: int) -> Table:
        """The columns' grid for ``tasks`` in ``width`` cells, without the optional groups that do not fit."""
        cells = {id(c): [c(task) for task in tasks] for c in self.columns if c is not self._bar}
        columns = list(self.columns)
        for group in [[], *self._optional]:
            columns = [column for column in columns if column not in group]
            least = len(columns) - 1  # one space between two columns
            for column in columns:
                if column is self._bar:
                    least += BAR_MIN_WIDTH
                else:
                    least += max((console.measure(cell).maximum for cell in cells[id(column)]), default=0)
            if least <= width:
                break
        table = Table.grid(*(c.get_table_column().copy() for c in columns), padding=(0, 1), expand=True)
        for row, task in enumerate(tasks):
            table.add_row(*(self._bar(task) if c is self._bar else cells[id(c)][row] for c in columns))
        return table


class _Fitting:
    """Renders :meth:`TwoLineProgress.fitting_table` at the width rich draws it in (known only then)."""

    def __init__(self, progress: TwoLineProgress, tasks: Sequence[Task]) -> None:
        self.progress = progress
        self.tasks = tasks

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.progress.fitting_table(self.tasks, console, options.max_width)


def _text(template: str) -> TextColumn:
    """A progress column of ``template`` that never wraps."""
    return TextColumn(template, table_column=Column(no_wrap=True))


class _ConsoleLogHandler(logging.Handler):
    """Prints log records above the live display, through its console."""

    def __init__(self, display: LiveProgress, level: int):
        super().__init__(level)
        self.display = display

    def emit(self, record: logging.LogRecord) -> None:
        task_run_name, flow_run_name = run_log_names(record)
        if not self.display.verbose and record.name.startswith(TASK_RUN_LOGGERS):
            # the prompt tasks' lines (a failed prompt's too: the flow logs one line for it) go to the
            # API only, as do every task's INFO lines; other tasks' warnings are shown
            if record.levelno < logging.WARNING or str(task_run_name or "").startswith("prompt-"):
                return
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record must not break the run
            return
        for name, kind in ((task_run_name, "Task run"), (flow_run_name, "Flow run")):
            if name and self.display.verbose:  # as Prefect's own console shows run loggers' lines
                message = f"{kind} {name!r} - {message}"
                break
        self.display.print(f"{record.levelname.lower()}: {message}")


class LiveProgress:
    """Context manager: the live display of the running flow, and the console's log lines.

    Args:
        verbose: also show Prefect's per-task INFO lines and hermes_core's debug lines.
        console: where to draw (default: stderr). On a terminal the display is drawn live:
            :attr:`display`, a :class:`TwoLineProgress` (a rich renderable) with the prompts' bar,
            done/total, rate, elapsed and ETA, and :func:`detail_line` below.
        get_time: the display's clock for elapsed and ETA (seconds; default rich's, monotonic).
    """

    def __init__(
        self,
        verbose: bool = False,
        console: Console | None = None,
        get_time: Callable[[], float] | None = None,
    ) -> None:
        self.console = console or _console
        self.verbose = verbose
        self._live = self.console.is_terminal
        bar = BarColumn(bar_width=None, table_column=Column(ratio=1))
        label = _text("[bold]prompts")
        rate = [_text("· {task.fields[rate]}")]
        elapsed = [_text("·"), TimeElapsedColumn(table_column=Column(no_wrap=True)), _text("elapsed")]
        self.display = TwoLineProgress(
            label,
            bar,
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            *rate,
            *elapsed,
            _text("· ETA"),
            TimeRemainingColumn(table_column=Column(no_wrap=True)),
            bar=bar,
            optional=(rate, elapsed, [label]),
            console=self.console,
            transient=False,
            get_time=get_time,
        )
        self._task = None
        self._last_line = 0.0
        self._handler = _ConsoleLogHandler(self, logging.INFO if verbose else logging.WARNING)
        self._silenced: list[tuple[logging.Handler, int]] = []

    def print(self, text: str) -> None:
        """Print one line above the display."""
        self.console.print(escape(text), soft_wrap=True, highlight=False)

    def __call__(self, progress: RunProgress, line: str | None) -> None:
        if line:
            self.print(line)
            if not self._live:
                return
        if not self._live:
            now = time.monotonic()
            if now - self._last_line >= SUMMARY_SECONDS or (
                progress.done == progress.total and progress.total
            ):
                self._last_line = now
                self.print(progress_line(progress))
            return
        fields = {"detail": detail_line(progress), "rate": f"{progress.rate:.2f}/s"}
        if self._task is None:
            self._task = self.display.add_task("run", total=progress.total, **fields)
        self.display.update(self._task, completed=progress.done, total=progress.total, **fields)

    def __enter__(self) -> LiveProgress:
        root = logging.getLogger()
        for handler in root.handlers:  # Prefect's console handler: records still reach its API handler
            if isinstance(handler, logging.StreamHandler):
                self._silenced.append((handler, handler.level))
                handler.setLevel(logging.CRITICAL + 1)
        root.addHandler(self._handler)
        if self._live:
            self.display.start()
        LISTENERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        LISTENERS.remove(self)
        if self._live:
            self.display.stop()
        logging.getLogger().removeHandler(self._handler)
        for handler, level in self._silenced:
            handler.setLevel(level)
        self._silenced.clear()


def print_summary(config: Any, state: Any) -> None:
    """Print the reference's summary: tool usage by count, reasoning coverage, discards, failures, duration, output.

    Only statistics written by this flow run (``statistics.json``'s ``flow_run_id``) are shown; a
    stopped or crashed run prints its state's message instead.
    """
    from flows.budget import BUDGET_REACHED

    out = Console()
    if state.is_cancelled():
        _console.print(f"[yellow]{state.message}[/yellow]", soft_wrap=True)
        return
    folder = RunFolder(config.run_dir)
    stats_path = folder.statistics
    stats: dict[str, Any] = json.loads(stats_path.read_text(encoding="utf-8")) if stats_path.exists() else {}
    if stats.get("flow_run_id") != str(state.state_details.flow_run_id):  # absent, or an older invocation's
        out.print(f"[red]the run ended before writing its statistics:[/red] {state.message}")
        return
    table = Table(title=f"Tool usage - run {config.run_name}")
    for column in ("tool", "calls", "success", "failure", "success %"):
        table.add_column(column, justify="left" if column == "tool" else "right")
    used = [(t, v) for t, v in stats["tool_statistics"].items() if v["count"]]
    for tool, v in sorted(used, key=lambda kv: (-kv[1]["count"], kv[0])):
        table.add_row(tool, str(v["count"]), str(v["success"]), str(v["failure"]), f"{v['success_rate']:.2f}")
    if not used:
        table.add_row("(no tool calls)", "", "", "", "")
    out.print(table)
    r = stats["reasoning_statistics"]
    out.print(
        f"Reasoning coverage: {r['turns_with_reasoning']}/{r['total_assistant_turns']} assistant turns "
        f"({r['coverage_percent']}%)"
    )
    if stats.get("scores"):
        out.print(f"Scores: {describe_scores(stats['scores'])}")
    if stats.get("pass_at_k"):
        out.print(f"Pass: {describe_pass_at_k(stats['pass_at_k'], stats.get('pass_hat_k'))}")
    if stats.get("compression"):
        out.print(f"Compression: {describe_compression(stats['compression'])}")
    if stats.get("stopped_when_passed"):
        out.print(f"Stopped when passed: {describe_stopped(stats['stopped_when_passed'])}")
    out.print(
        f"Prompts: {stats['total_prompts']} · trajectories: {stats['completed']} · "
        f"discarded (no reasoning): {stats['discarded_no_reasoning']} · "
        f"filtered (hallucinated tool): {stats['filtered_hallucinated']} · failed: {stats['failed']}"
    )
    cost = stats.get("cost_usd")
    tokens = stats["tokens"]
    out.print(
        f"Tokens: {tokens['total']} · cost: {'n/a' if cost is None else f'${cost:.4f}'} · "
        f"duration: {stats['duration_seconds']} s"
    )
    out.print(f"Output: {folder.trajectories} (statistics: {stats_path})")
    out.print(f"View it: hermes-batch view {config.run_dir}")
    if stats["failed"]:
        out.print(
            f"[yellow]{stats['failed']} prompts failed[/yellow]: see {folder.failures}; "
            "run again with --resume to retry only them."
        )
    if state.name == BUDGET_REACHED:
        out.print(f"[yellow]{escape(state.message or '')}[/yellow]", soft_wrap=True)
    pilot_path = folder.pilot
    if getattr(config, "pilot", None) and pilot_path.exists():
        from flows.pilot import summary_line

        out.print(summary_line(json.loads(pilot_path.read_text(encoding="utf-8"))), soft_wrap=True)
        out.print(f"Pilot report: {pilot_path}")
