"""Terminal output of the command line: a live progress bar and the end-of-run summary table (rich)."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from flows.progress import LISTENERS, RunProgress

_console = Console(stderr=True)


class LiveProgress:
    """Context manager showing prompts done / total, failed, discarded, rate and ETA while the flow runs."""

    def __init__(self, total: int):
        self.total = total
        self._progress = Progress(
            TextColumn("[bold]prompts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=_console,
            transient=False,
        )
        self._task = None

    def __call__(self, progress: RunProgress) -> None:
        rate = progress.done / max(1e-6, time.monotonic() - progress.started)
        detail = f"failed {progress.failed} · discarded {progress.discarded} · {rate:.2f}/s"
        if self._task is None:
            self._task = self._progress.add_task("run", total=progress.total, detail=detail)
        self._progress.update(self._task, completed=progress.done, total=progress.total, detail=detail)

    def __enter__(self) -> LiveProgress:
        self._progress.start()
        LISTENERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        LISTENERS.remove(self)
        self._progress.stop()


def print_summary(config: Any, state: Any) -> None:
    """Print the reference's summary: tool usage by count, reasoning coverage, discards, failures, duration, output."""
    out = Console()
    stats_path = config.run_dir / "statistics.json"
    if not stats_path.exists():
        out.print(f"[red]run failed before writing statistics:[/red] {state.message}")
        return
    stats: dict[str, Any] = json.loads(stats_path.read_text(encoding="utf-8"))
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
    out.print(f"Output: {config.run_dir / 'trajectories.jsonl'} (statistics: {stats_path})")
    out.print(f"View it: hermes-batch view {config.run_dir}")
    if stats["failed"]:
        out.print(
            f"[yellow]{stats['failed']} prompts failed[/yellow]: see {config.run_dir / 'failures.jsonl'}; "
            "run again with --resume to retry only them."
        )
