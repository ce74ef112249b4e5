"""Live progress of a run: a Prefect progress artifact, plus listeners (the command line's live display)."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from hermes_core.usage import Usage
from tasks.statistics import artifact_key

LISTENERS: list[Callable[[RunProgress, str | None], None]] = []
"""Called (in the flow's thread) after every change with the progress and an event line or None:
the start and end of the run and one line per failed prompt. The command line registers its display here."""


PUSH_EVERY_SECONDS = 2.0
"""Least time between two updates of the progress artifact while prompts finish (seconds)."""

_log = logging.getLogger(__name__)


class LatestOnly:
    """Calls ``send(*value)`` in a daemon thread with the newest value offered; older unsent ones are dropped.

    The flow's dispatcher thread hands progress to it instead of waiting for the Prefect API: an
    artifact update took up to 6.4 s under a busy server at W = 1,024, and every prompt that ended
    meanwhile waited to be recorded (bench/ANALYSIS.md). :meth:`send_now` sends in the caller's
    thread and is never overtaken by an older value. A failed send is logged (debug) and dropped:
    the next value replaces it. The thread runs in a copy of the creator's context (Prefect
    settings, the API in use).
    """

    def __init__(self, send):
        self._send_fn = send
        self._cv = threading.Condition()
        self._offered: tuple[int, tuple] | None = None
        self._seq = 0
        self._sent_seq = 0
        self._send_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._loop,), name="hermes-progress", daemon=True
        )
        self._thread.start()

    def offer(self, *value: Any) -> None:
        """Queue ``value`` to be sent, replacing one not sent yet (returns at once)."""
        with self._cv:
            self._seq += 1
            self._offered = (self._seq, value)
            self._cv.notify()

    def send_now(self, *value: Any) -> None:
        """Send ``value`` in this thread (after a send in progress), dropping any value not sent yet."""
        with self._cv:
            self._seq += 1
            seq, self._offered = self._seq, None
        self._send(seq, value)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread once it has sent what was offered (waits at most ``timeout`` seconds)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)

    def _send(self, seq: int, value: tuple) -> None:
        with self._send_lock:
            if seq <= self._sent_seq:
                return
            self._sent_seq = seq
            try:
                self._send_fn(*value)
            except Exception as exc:  # noqa: BLE001 - progress is best effort; the next value replaces it
                _log.debug("progress update failed: %s", exc)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._offered is None and not self._closed:
                    self._cv.wait()
                if self._offered is None:
                    return
                (seq, value), self._offered = self._offered, None
            self._send(seq, value)


@dataclass
class RunProgress:
    """Counts of one invocation. ``total`` = pending prompts this invocation runs (less the skipped ones).

    Attributes:
        scored: rows of this invocation with a score (``metadata.passed`` set); ``passed``: those that passed.
        skipped: samples that did not start because their record had passed (``--stop_when_passed``).
        tokens: prompt + completion tokens of the prompts finished in this invocation.
        cost: their provider-reported cost in USD (None until one reports a cost).
        meter: returns the run-wide figures (every invocation), or None: ``{"run_tokens",
            "run_cost", "projected_tokens", "projected_cost"`` (whole dataset, at the mean per
            prompt so far), ``"max_cost_usd", "max_total_tokens", "limit"`` (model requests in
            flight now), ``"rate_limited"`` (rate-limit answers so far)``}``.
    """

    run_name: str
    total: int
    already_finished: int = 0
    completed: int = 0
    discarded: int = 0
    failed: int = 0
    scored: int = 0
    passed: int = 0
    skipped: int = 0
    tokens: int = 0
    cost: float | None = None
    started: float = field(default_factory=time.monotonic)
    meter: Callable[[], dict[str, Any]] | None = None
    _artifact_id: object = None
    _last_push: float = 0.0
    _pusher: LatestOnly | None = None

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

    def figures(self) -> dict[str, Any]:
        """The :attr:`meter`'s figures now (empty without a meter)."""
        return self.meter() if self.meter else {}

    def open(self, line: str | None = None) -> RunProgress:
        """Create the progress artifact and notify listeners (``line``: the run's start line).

        Later updates of the artifact are sent from a thread of their own (:class:`LatestOnly`): call
        :meth:`close` when the prompts are done.
        """
        self._artifact_id = create_progress_artifact(
            progress=self.percent,
            key=artifact_key(self.run_name, "progress"),
            description=f"Prompts finished in this flow run of {self.run_name} ({self.total} to run)",
        )
        self._pusher = LatestOnly(self._update_artifact)
        self._last_push = time.monotonic()  # the artifact was just created with these figures
        self._notify(line=line)
        return self

    def close(self) -> None:
        """Send the artifact its final figures and stop the update thread (no-op if not open)."""
        if self._pusher is not None:
            self._pusher.send_now(self.percent, self.describe())
            self._pusher.close()
            self._pusher = None

    def record(
        self,
        kind: str,
        usage: dict[str, Any] | None = None,
        line: str | None = None,
        passed: bool | None = None,
    ) -> None:
        """Count one finished prompt: ``completed``, ``discarded`` or ``failed``, with its usage
        (the stored ``{prompt_tokens, completion_tokens, reasoning_tokens, cost}`` form, or None)
        and, for a scored row, whether it passed (its ``metadata.passed``; None: not scored)."""
        setattr(self, kind, getattr(self, kind) + 1)
        if passed is not None:
            self.scored += 1
            self.passed += bool(passed)
        if usage:
            spent = Usage.from_dict(usage)
            self.tokens += spent.total_tokens
            if spent.cost is not None:
                self.cost = (self.cost or 0.0) + spent.cost
        self._notify(line=line)

    def skip(self) -> None:
        """Count one sample that will not start (``--stop_when_passed``): it leaves :attr:`total`."""
        self.skipped += 1
        self.total -= 1
        self._notify()

    def pass_text(self) -> str:
        """``pass 7/10`` (rows of this invocation that passed / were scored), ``""`` before any was scored."""
        return f"pass {self.passed}/{self.scored}" if self.scored else ""

    def announce(self, line: str) -> None:
        """Tell the listeners one event line (e.g. the end of the run)."""
        for listener in LISTENERS:
            listener(self, line)

    def _notify(self, line: str | None = None) -> None:
        """Tell the listeners; offer the artifact its figures at most every PUSH_EVERY_SECONDS (the final
        figures are sent by :meth:`close`)."""
        for listener in LISTENERS:
            listener(self, line)
        now = time.monotonic()
        if self._pusher is not None and now - self._last_push >= PUSH_EVERY_SECONDS:
            self._last_push = now
            self._pusher.offer(self.percent, self.describe())

    def _update_artifact(self, percent: float, description: str) -> None:
        update_progress_artifact(self._artifact_id, progress=percent, description=description)

    def describe(self) -> str:
        """The artifact's description: counts, the pass rate, and the run's spend, projection and request limit.

        E.g. ``10/12 prompts of my-run in this flow run (0 failed, 2 skipped) · pass 7/10 · run 1234 tokens``.
        """
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        text = f"{self.done}/{self.total} prompts of {self.run_name} in this flow run ({self.failed} failed{skipped})"
        if self.scored:
            text += f" · {self.pass_text()}"
        figures = self.figures()
        if figures:
            text += " · " + meter_text(figures)
        return text


def meter_text(figures: dict[str, Any]) -> str:
    """``run: 12345 tokens, $0.0123 (projected 50000 tokens, $0.05) · limit 4 · 429s 3`` from meter figures."""
    cost = figures.get("run_cost")
    spent = f"{figures.get('run_tokens', 0)} tokens" + ("" if cost is None else f", ${cost:.4f}")
    cap = [
        f"${figures['max_cost_usd']:g}" if figures.get("max_cost_usd") is not None else "",
        f"{figures['max_total_tokens']} tokens" if figures.get("max_total_tokens") is not None else "",
    ]
    cap_text = f" of cap {' / '.join(c for c in cap if c)}" if any(cap) else ""
    projected = ""
    if figures.get("projected_tokens") is not None:
        p_cost = figures.get("projected_cost")
        projected = f" (projected {figures['projected_tokens']} tokens" + (
            ")" if p_cost is None else f", ${p_cost:.4f})"
        )
    text = f"run {spent}{cap_text}{projected}"
    if figures.get("limit") is not None:
        text += f" · limit {figures['limit']} · 429s {figures.get('rate_limited', 0)}"
    return text
