"""The run's spend cap (README § Run control, the spend cap): whether the next prompt, and the next model
request, may start, and what to say when not.

The spend is the whole run's, every invocation, from the ledger (:class:`hermes_core.runfolder.spend.SpendTally`,
kept current by the ledger as rows, tombstones and failures are written), and, between two
ledger writes, the usage of every model request this process made (told by the model client
through :mod:`hermes_core.spend_guard`). Cost is the provider-reported ``usage.cost``; tokens of
requests without one are priced with ``price_per_mtok_in`` / ``price_per_mtok_out`` (USD per
million prompt / completion tokens).

Prompts: while no prompt of the run has finished (nothing is known of what one costs), one
prompt runs at a time (slow start). After that the next prompt may start when the spend so far
plus what the prompts in flight and that prompt are expected to spend (each: the run's mean
spend per finished prompt) stays within every cap.

Requests: before each model request, the cap is reached when the spend so far is at the cap, or
would pass it with one more request at this invocation's mean cost per request. Then no new
prompt starts; with ``on_budget=cancel`` that request is not sent and every running prompt is
cancelled (they stay pending for ``--resume``); with ``drain`` the running prompts finish.

The bound: the spend passes the cap by at most what the requests in flight at the moment it was
reached cost (``cancel``), or what the prompts in flight then spend to their end (``drain``);
before the first answer of a run, that is one request of one prompt. The overshoot is reported.
Prompts on Dask workers (other processes) are checked when they start, not per request.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Any

from hermes_core import cancel
from hermes_core.exceptions import PromptCancelled
from hermes_core.runfolder.spend import Spend, SpendTally
from hermes_core.usage import Usage

BUDGET_REACHED = "BudgetReached"
"""Name of the Failed state of a flow run that reached its spend cap (the command line exits 3)."""


def cost_source(config: Any) -> str | None:
    """Where a run's cost comes from: ``"provider"``, ``"prices"``, or None (cost unknown).

    ``provider`` when the endpoint is known to report ``usage.cost``: OpenRouter (the client asks
    for it), or a ``mock/`` model id that sets ``cost``. ``prices`` when a price is given.
    """
    from hermes_core.client import reports_cost
    from hermes_core.mockllm import is_mock_model, parse_model_options

    if is_mock_model(config.model):
        try:
            if parse_model_options(config.model).cost is not None:
                return "provider"
        except ValueError:
            pass
    else:
        from hermes_core.settings import HermesSettings

        if reports_cost(config.base_url or HermesSettings().base_url):
            return "provider"
    if config.price_per_mtok_in is not None or config.price_per_mtok_out is not None:
        return "prices"
    return None


class Admission(enum.Enum):
    """The answer of :meth:`Budget.admission` for the next prompt."""

    START = "start"
    """It may start."""
    WAIT = "wait"
    """Not yet: no prompt of the run has finished and one runs (slow start)."""
    CAP = "cap"
    """Never in this invocation: the cap is reached or would be passed (call :meth:`Budget.refuse`)."""


class Budget:
    """The caps of one run against its ledger's spend.

    Args:
        tally: the run's spend, kept current by the ledger.
        max_cost_usd: USD cap, or None.
        max_total_tokens: prompt + completion tokens cap, or None.
        price_in / price_out: USD per million prompt / completion tokens without a reported cost.
        on_budget: ``drain`` (running prompts finish) or ``cancel`` (they are cancelled).

    Attributes:
        reached: True once a prompt or a request was refused for the cap (:meth:`refuse`).
        spent_at_stop: the spend when the cap was reached (for the overshoot), or None.

    It is the run's :class:`hermes_core.spend_guard.RequestGuard` (:meth:`before_request`,
    :meth:`after_request`); thread-safe.
    """

    def __init__(
        self,
        tally: SpendTally,
        *,
        max_cost_usd: float | None = None,
        max_total_tokens: int | None = None,
        price_in: float | None = None,
        price_out: float | None = None,
        on_budget: str = "drain",
    ):
        self.tally = tally
        self.max_cost_usd = max_cost_usd
        self.max_total_tokens = max_total_tokens
        self.price_in = price_in
        self.price_out = price_out
        self.on_budget = on_budget
        self.reached = False
        self.spent_at_stop: tuple[float | None, int] | None = None
        self._before = dataclasses.replace(tally.total)  # the spend of earlier invocations
        self._requests = Spend()  # every answered model request of this process since
        self._lock = threading.RLock()

    @classmethod
    def of(cls, config: Any, tally: SpendTally) -> Budget:
        """The budget of a :class:`~flows.config.BatchConfig` over ``tally``."""
        return cls(
            tally,
            max_cost_usd=config.max_cost_usd,
            max_total_tokens=config.max_total_tokens,
            price_in=config.price_per_mtok_in,
            price_out=config.price_per_mtok_out,
            on_budget=config.on_budget,
        )

    @property
    def capped(self) -> bool:
        """True when a cap is set."""
        return self.max_cost_usd is not None or self.max_total_tokens is not None

    @property
    def spent(self) -> Spend:
        """The run's spend so far (a live object: do not change it)."""
        return self.tally.total

    @property
    def cost(self) -> float | None:
        """USD spent by the run so far (None when no cost is known)."""
        return self.spent.cost_usd(self.price_in, self.price_out)

    def admission(self, in_flight: int) -> Admission:
        """Whether one more prompt may start with ``in_flight`` prompts running; O(1), no side effect.

        Returns:
            :attr:`Admission.START` when it may; :attr:`Admission.WAIT` while no prompt of the run
            has finished and one runs (slow start: ask again when it ends); :attr:`Admission.CAP`
            when the cap is reached, or would be passed by the spend so far plus the prompts in
            flight and this one at the run's mean spend per finished prompt. On ``CAP`` the
            caller stops admitting prompts and calls :meth:`refuse`.
        """
        if not self.capped:
            return Admission.START
        with self._lock:
            if self.reached:
                return Admission.CAP
            cost, tokens = self._current()
            if self._over(cost, tokens):
                return Admission.CAP
            finished = self.spent.records
            if not finished:  # slow start: one prompt until one has finished
                return Admission.START if in_flight == 0 else Admission.WAIT
            share = (in_flight + 1) / finished  # the prompts running and this one, each at the mean
            if self._over(cost * (1 + share), tokens * (1 + share)):
                return Admission.CAP
            return Admission.START

    def allows(self, in_flight: int) -> bool:
        """Whether one more prompt may start with ``in_flight`` prompts running (:meth:`admission`
        is ``START``); no side effect."""
        return self.admission(in_flight) is Admission.START

    def refuse(self) -> None:
        """The run admits no more prompts for the cap: turn :attr:`reached` on (idempotent).

        The first call records :attr:`spent_at_stop` and stops new attempts of this process
        (:func:`hermes_core.cancel.hold_new_prompts`: a retry that would start later ends without
        a trajectory and stays pending; prompts already admitted run); with ``on_budget=cancel``
        it also cancels the running ones (:func:`hermes_core.cancel.cancel_running`, in a thread).
        The dispatcher calls it when :meth:`admission` says ``CAP``; :meth:`before_request` when
        a model request finds the cap reached.
        """
        with self._lock:
            if self.reached:
                return
            self.reached = True
            self.spent_at_stop = self._current()
        cancel.hold_new_prompts()
        if self.on_budget == "cancel":
            threading.Thread(target=cancel.cancel_running, name="hermes-budget-cancel", daemon=True).start()

    def before_request(self) -> None:
        """Before a model request: reach the cap if the spend is at it, or would pass it with one
        more request at this invocation's mean cost per request.

        Raises:
            PromptCancelled: the cap is reached and ``on_budget`` is ``cancel`` (the request is not sent).
        """
        if not self.capped:
            return
        with self._lock:
            if not self.reached:
                cost, tokens = self._current()
                requests = self._requests
                per_cost = (requests.cost_usd(self.price_in, self.price_out) or 0.0) / max(
                    requests.records, 1
                )
                per_tokens = requests.total_tokens / max(requests.records, 1)
                if self._over(cost, tokens, at=True) or self._over(cost + per_cost, tokens + per_tokens):
                    self.refuse()
            if self.reached and self.on_budget == "cancel":
                raise PromptCancelled("budget reached: the model request was not sent")

    def after_request(self, usage: Usage) -> None:
        """Count an answered model request's usage (tokens, cost in USD) in the run's spend."""
        if self.capped:
            with self._lock:
                self._requests.add_usage(usage)

    def _current(self) -> tuple[float, int]:
        """The run's spend now (USD, tokens): the ledger's, or earlier invocations' plus this
        process's requests when that is more (prompts still running)."""
        live = dataclasses.replace(self._before)
        live.merge(self._requests)
        cost = max(self.cost or 0.0, live.cost_usd(self.price_in, self.price_out) or 0.0)
        return cost, max(self.spent.total_tokens, live.total_tokens)

    def _over(self, cost: float, tokens: float, *, at: bool = False) -> bool:
        """Whether ``cost`` (USD) or ``tokens`` pass a cap (``at``: or are at it)."""
        if self.max_total_tokens is not None and (
            tokens >= self.max_total_tokens if at else tokens > self.max_total_tokens
        ):
            return True
        return self.max_cost_usd is not None and (
            cost >= self.max_cost_usd if at else cost > self.max_cost_usd
        )

    def figures(self) -> dict[str, Any]:
        """``{"cost_usd", "tokens", "max_cost_usd", "max_total_tokens", "overshoot_usd", "overshoot_tokens"}``.

        The overshoot is what was spent after the cap was reached (the prompts in flight then),
        beyond the cap; 0 when the spend stayed within it; None when the cap was not reached.
        """
        cost, tokens = self.cost, self.spent.total_tokens
        over_usd = over_tokens = None
        if self.reached:
            over_usd = round(max(0.0, (cost or 0.0) - self.max_cost_usd), 8) if self.max_cost_usd else 0.0
            over_tokens = max(0, tokens - self.max_total_tokens) if self.max_total_tokens else 0
        return {
            "cost_usd": None if cost is None else round(cost, 8),
            "tokens": tokens,
            "max_cost_usd": self.max_cost_usd,
            "max_total_tokens": self.max_total_tokens,
            "overshoot_usd": over_usd,
            "overshoot_tokens": over_tokens,
        }

    def spent_text(self) -> str:
        """What the whole run spent so far: ``4512 tokens, $0.0123`` (``cost n/a`` when no cost is known)."""
        cost = self.cost
        return f"{self.spent.total_tokens} tokens, " + ("cost n/a" if cost is None else f"${cost:.4f}")

    def message(self, done: int, total: int) -> str:
        """``N of M prompts done, $S spent of $C cap; raise the cap and resume to continue`` (tokens too)."""
        parts = []
        if self.max_cost_usd is not None:
            parts.append(f"${self.cost or 0.0:.4f} spent of ${self.max_cost_usd:g} cap")
        if self.max_total_tokens is not None:
            parts.append(f"{self.spent.total_tokens} tokens spent of {self.max_total_tokens} cap")
        figures = self.figures()
        over = []
        if figures["overshoot_usd"]:
            over.append(f"${figures['overshoot_usd']:.4f}")
        if figures["overshoot_tokens"]:
            over.append(f"{figures['overshoot_tokens']} tokens")
        overshoot = (
            f" (overshoot {', '.join(over)}: the prompts in flight when it was reached)" if over else ""
        )
        return (
            f"budget reached: {done} of {total} prompts done, {', '.join(parts)}{overshoot}; "
            "raise the cap and resume to continue"
        )


def projection(spent: Spend, finished: int, total: int, price_in=None, price_out=None) -> dict[str, Any]:
    """The whole dataset's projected tokens and cost at the run's mean per finished prompt so far.

    Args:
        spent: the run's spend.
        finished: prompts of the run with a usage record so far (rows, tombstones, failures).
        total: prompts in the dataset.

    Returns:
        ``{"tokens": int | None, "cost_usd": float | None}`` (None before any prompt finished or
        without a cost).
    """
    if finished <= 0:
        return {"tokens": None, "cost_usd": None}
    cost = spent.cost_usd(price_in, price_out)
    return {
        "tokens": round(spent.total_tokens / finished * total),
        "cost_usd": None if cost is None else round(cost / finished * total, 6),
    }


__all__ = ["BUDGET_REACHED", "Admission", "Budget", "cost_source", "projection"]
