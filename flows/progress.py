"""Live progress of a run: a Prefect progress artifact, plus listeners (the command line's progress bar)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prefect.artifacts import create_progress_artifact, update_progress_artifact

LISTENERS: list[Callable[[RunProgress], None]] = []
"""Called (in the flow's thread) after every change; the command line registers its progress bar here."""


def artifact_key(run_name: str, suffix: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for a run."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_name}-{suffix}".lower()).strip("-")


@dataclass
class RunProgress:
    """Counts of one invocation. ``total`` = pending prompts this invocation runs."""

    run_name: str
    total: int
    already_finished: int = 0
    completed: int = 0
    discarded: int = 0
    failed: int = 0
    started: float = field(default_factory=time.monotonic)
    _artifact_id: object = None
    _last_push: float = 0.0

    @property
    def done(self) -> int:
        return self.completed + self.discarded + self.failed

    @property
    def percent(self) -> float:
        return 100.0 if self.total == 0 else round(100.0 * self.done / self.total, 1)

    def open(self) -> RunProgress:
        """Create the progress artifact and notify listeners."""
        self._artifact_id = create_progress_artifact(
            progress=self.percent,
            key=artifact_key(self.run_name, "progress"),
            description=f"Prompts finished in this flow run of {self.run_name} ({self.total} to run)",
        )
        self._notify(force=True)
        return self

    def record(self, kind: str) -> None:
        """Count one finished prompt: ``completed``, ``discarded`` or ``failed``."""
        setattr(self, kind, getattr(self, kind) + 1)
        self._notify(force=self.done == self.total)

    def _notify(self, force: bool) -> None:
        for listener in LISTENERS:
            listener(self)
        now = time.monotonic()
        if self._artifact_id and (force or now - self._last_push >= 2.0):
            self._last_push = now
            update_progress_artifact(self._artifact_id, progress=self.percent)
