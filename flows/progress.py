"""Live progress of a run: a Prefect progress artifact, plus listeners (the command line's live display)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

LISTENERS: list[Callable[[RunProgress, str | None], None]] = []
"""Called (in the flow's thread) after every change with the progress and an event line or None:
the start and end of the run and one line per failed prompt. The command line registers its display here."""


def artifact_key(run_name: str, suffix: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for a run."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_name}-{suffix}".lower()).strip("-")


@dataclass
class RunProgress:
    """Counts of one invocation. ``total`` = pending prompts this invocation runs.

    Attributes:
        tokens: prompt + completion tokens of the prompts finished in this invocation.
        cost: their provider-reported cost in USD (None until one reports a cost).
    """

    run_name: str
    total: int
    already_finished: int = 0
    completed: int = 0
    discarded: int = 0
    failed: int = 0
    tokens: int = 0
    cost: float | None = None
    started: float = field(default_factory=time.monotonic)
    _artifact_id: object = None
    _last_push: float = 0.0

    @property
    def done(self) -> int:
        return self.completed + self.discarded + self.failed

    @property
    def percent(self) -> float:
        return 100.0 if self.total == 0 else round(100.0 * self.done / self.total, 1)

    @property
    def rate(self) -> float:
        """Prompts finished per second in this invocation."""
        return self.done / max(1e-6, time.monotonic() - self.started)

    def open(self, line: str | None = None) -> RunProgress:
        """Create the progress artifact and notify listeners (``line``: the run's start line)."""
        self._artifact_id = create_progress_artifact(
            progress=self.percent,
            key=artifact_key(self.run_name, "progress"),
            description=f"Prompts finished in this flow run of {self.run_name} ({self.total} to run)",
        )
        self._notify(force=True, line=line)
        return self

    def record(self, kind: str, usage: dict[str, Any] | None = None, line: str | None = None) -> None:
        """Count one finished prompt: ``completed``, ``discarded`` or ``failed``, with its token usage."""
        setattr(self, kind, getattr(self, kind) + 1)
        if usage:
            self.tokens += int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
            if usage.get("cost") is not None:
                self.cost = (self.cost or 0.0) + float(usage["cost"])
        self._notify(force=self.done == self.total, line=line)

    def announce(self, line: str) -> None:
        """Tell the listeners one event line (e.g. the end of the run)."""
        for listener in LISTENERS:
            listener(self, line)

    def _notify(self, force: bool, line: str | None = None) -> None:
        for listener in LISTENERS:
            listener(self, line)
        now = time.monotonic()
        if self._artifact_id and (force or now - self._last_push >= 2.0):
            self._last_push = now
            update_progress_artifact(self._artifact_id, progress=self.percent)
