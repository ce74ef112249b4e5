"""Adaptive concurrency: one run-wide limit on model requests in flight (README § Run control).

:class:`ConcurrencyLimiter` is shared by every prompt of a run in this process
(:func:`run_limiter`); :class:`~hermes_core.client.ModelClient` calls :meth:`~ConcurrencyLimiter.acquire`
before each HTTP request and :meth:`~ConcurrencyLimiter.release` with its outcome after it, so the
client's own retries wait on the limiter too.

The policy is AIMD (additive increase, multiplicative decrease), as TCP congestion control:

* the limit starts at ``max_limit`` (the run's ``num_workers``);
* a rate-limit answer (429, or 503) halves it (at least 1), once per congestion event: answers to
  requests that started before the last cut do not cut again (a burst of 12 refusals is one
  event), and every new request is held until the answer's ``Retry-After`` has passed
  (:data:`DEFAULT_HOLD_SECONDS` without one);
* after a quiet stretch with successes and no rate-limit answer, it grows by one step, back to
  ``max_limit``. A stretch is :data:`QUIET_SECONDS` (a probe), except below the highest limit
  known to be fine (one that went a whole stretch without a refusal and is below every limit
  refused since): there regrowth takes :data:`RECOVER_SECONDS` a step;
* ``x-ratelimit-remaining-requests: 0`` with ``x-ratelimit-reset-requests`` holds new requests
  until the reset (the limit itself is not cut: the provider said so before refusing).

Uncontended, :meth:`acquire` and :meth:`release` are one lock round trip and a clock read each
(well under a microsecond); only a request that must wait pays for the wait. With the Dask task
runner every worker process has its own limiter.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from hermes_core import cancel
from hermes_core.exceptions import PromptTimeout

RATE_LIMIT_STATUS = frozenset({429, 503})
"""HTTP statuses that count as a rate-limit answer."""
DEFAULT_HOLD_SECONDS = 0.5
"""Hold after a rate-limit answer without ``Retry-After``, seconds."""
MAX_HOLD_SECONDS = 60.0
"""Longest hold honoured, seconds (a longer ``Retry-After`` or reset is cut to this)."""
RECOVER_SECONDS = 0.5
"""Quiet stretch before one step of growth below the last refused limit, seconds."""
QUIET_SECONDS = 10.0
"""Quiet stretch before one step of growth at or above the last refused limit (a probe), seconds."""
_WAIT_SLICE = 0.25  # a waiting request re-checks the cancel flag this often, seconds


class ConcurrencyLimiter:
    """A run-wide, adaptive limit on model requests in flight; thread-safe.

    Args:
        max_limit: the most requests in flight (>= 1), and the starting limit.
        adaptive: False: never limits nor holds, only counts rate-limit answers.
        clock: monotonic clock in seconds (tests may pass their own).

    Attributes:
        max_limit: as given.
        adaptive: as given.
    """

    def __init__(self, max_limit: int, *, adaptive: bool = True, clock: Callable[[], float] = time.monotonic):
        if max_limit < 1:
            raise ValueError(f"max_limit must be at least 1, got {max_limit}")
        self.max_limit = max_limit
        self.adaptive = adaptive
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._limit = max_limit
        self._lowest = max_limit
        self._good = 0  # highest limit known to be fine; below it, regrowth is fast
        self._in_flight = 0
        self._hold_until = 0.0
        self._generation = 0  # +1 at each cut; a slot remembers the generation it started in
        self._last_change = clock()
        self._successes_since_change = 0
        self._rate_limited = 0
        self._requests = 0

    @property
    def limit(self) -> int:
        """The current limit on requests in flight."""
        return self._limit

    @property
    def rate_limited(self) -> int:
        """Rate-limit answers (429/503) seen so far."""
        return self._rate_limited

    def acquire(self, deadline: float | None = None) -> int:
        """Wait for a slot (fewer than ``limit`` in flight, no hold); returns the slot's ticket for :meth:`release`.

        Args:
            deadline: ``time.monotonic()`` value by which the slot must be had, or None.

        Raises:
            PromptTimeout: the deadline passed while waiting.
            PromptCancelled: the run was cancelled while waiting.
        """
        with self._cond:
            if not self.adaptive or (self._in_flight < self._limit and self._clock() >= self._hold_until):
                self._in_flight += 1
                self._requests += 1
                return self._generation
            while True:
                now = self._clock()
                if self._in_flight < self._limit and now >= self._hold_until:
                    self._in_flight += 1
                    self._requests += 1
                    return self._generation
                if deadline is not None and time.monotonic() >= deadline:
                    raise PromptTimeout("prompt deadline passed while waiting for a model request slot")
                cancel.check_cancelled()
                wait = _WAIT_SLICE if now >= self._hold_until else min(_WAIT_SLICE, self._hold_until - now)
                self._cond.wait(max(wait, 0.001))

    def release(
        self,
        ticket: int,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Give the slot back with the request's outcome.

        Args:
            ticket: what :meth:`acquire` returned.
            status: HTTP status of the answer (200 for success), None when there was no answer
                (timeout, connection error, cancel): then nothing is learnt.
            retry_after: seconds the provider asked to wait, when it said.
            headers: response headers (``x-ratelimit-remaining-requests`` /
                ``x-ratelimit-reset-requests`` are read), or None.
        """
        hold = _reset_hold(headers) if headers is not None else None
        with self._cond:
            self._in_flight -= 1
            now = self._clock()
            if status in RATE_LIMIT_STATUS:
                self._rate_limited += 1
                if self.adaptive:
                    self._on_rate_limit(ticket, now, retry_after)
            elif status is not None and status < 400 and self.adaptive:
                self._on_success(now)
            if hold is not None and self.adaptive:
                self._hold_until = max(self._hold_until, now + hold)
            self._cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """``{"adaptive", "limit", "max_limit", "lowest_limit", "in_flight", "requests", "rate_limited"}``."""
        with self._cond:
            return {
                "adaptive": self.adaptive,
                "limit": self._limit,
                "max_limit": self.max_limit,
                "lowest_limit": self._lowest,
                "in_flight": self._in_flight,
                "requests": self._requests,
                "rate_limited": self._rate_limited,
            }

    def _on_rate_limit(self, ticket: int, now: float, retry_after: float | None) -> None:
        hold = DEFAULT_HOLD_SECONDS if retry_after is None or retry_after <= 0 else retry_after
        self._hold_until = max(self._hold_until, now + min(hold, MAX_HOLD_SECONDS))
        if ticket != self._generation:
            return  # started before the last cut: the same congestion event
        self._good = min(self._good, self._limit - 1)
        self._limit = max(1, self._limit // 2)
        self._lowest = min(self._lowest, self._limit)
        self._generation += 1
        self._last_change = now
        self._successes_since_change = 0

    def _on_success(self, now: float) -> None:
        self._successes_since_change += 1
        if self._limit >= self.max_limit:
            return
        stretch = RECOVER_SECONDS if self._limit < self._good else QUIET_SECONDS
        if now - max(self._last_change, self._hold_until) >= stretch:
            self._good = max(self._good, self._limit)  # a whole stretch at this limit without a refusal
            self._limit += 1
            self._last_change = now
            self._successes_since_change = 0


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_reset(value: str) -> float | None:
    """Seconds until a rate-limit window resets, from an ``x-ratelimit-reset-requests`` value.

    Accepts seconds (``"1.5"``), durations (``"6m0s"``, ``"20ms"``, ``"1h2m"``) and epoch times
    (seconds, or milliseconds as OpenRouter sends). Returns None when it cannot be read.
    """
    value = value.strip()
    try:
        number = float(value)
    except ValueError:
        parts = _DURATION_RE.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            return None
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        return sum(float(n) * scale[u] for n, u in parts)
    if number > 1e12:  # epoch milliseconds
        return number / 1000 - time.time()
    if number > 1e9:  # epoch seconds
        return number - time.time()
    return number


def _reset_hold(headers: Mapping[str, str]) -> float | None:
    """Seconds to hold new requests when the provider says no request is left in its window, else None."""
    remaining = headers.get("x-ratelimit-remaining-requests")
    if remaining is None:
        return None
    try:
        if float(remaining) > 0:
            return None
    except ValueError:
        return None
    reset = headers.get("x-ratelimit-reset-requests")
    seconds = parse_reset(reset) if reset else None
    if seconds is None:
        return DEFAULT_HOLD_SECONDS
    return min(max(seconds, 0.0), MAX_HOLD_SECONDS)


_limiters: dict[str, ConcurrencyLimiter] = {}
_limiters_lock = threading.Lock()


def run_limiter(key: str, max_limit: int, *, adaptive: bool = True) -> ConcurrencyLimiter:
    """The limiter shared by every prompt of run ``key`` in this process (made on first use).

    A new limiter replaces the old one when ``max_limit`` or ``adaptive`` changed (a new invocation
    with another ``num_workers``).
    """
    with _limiters_lock:
        limiter = _limiters.get(key)
        if limiter is None or limiter.max_limit != max_limit or limiter.adaptive != adaptive:
            limiter = _limiters[key] = ConcurrencyLimiter(max_limit, adaptive=adaptive)
        return limiter


__all__ = ["RATE_LIMIT_STATUS", "ConcurrencyLimiter", "parse_reset", "run_limiter"]
