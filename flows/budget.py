"""The run's spend cap (SPEC section 13, Budget): whether the next prompt may start, and what to say when not.

The spend is the whole run's, every invocation, from the ledger (:class:`tasks.spend.SpendTally`,
kept current by the ledger as rows, tombstones and failures are written). Cost is the
provider-reported ``usage.cost``; tokens of requests without one are priced with
``price_per_mtok_in`` / ``price_per_mtok_out`` (USD per million prompt / completion tokens).

The next prompt may start when the spend so far plus what the prompts in flight and that prompt
are expected to spend (each: the run's mean spend per finished prompt; 0 before any finished)
stays within every cap. Once a prompt is refused, none starts again in this invocation. So the
overshoot is bounded by the prompts in flight when the cap is reached (what they spend beyond
the mean), and it is reported.
"""

from __future__ import annotations

import threading
from typing import Any

from hermes_core import cancel
from tasks.spend import Spend, SpendTally


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


class Budget:
    """The caps of one run against its ledger's spend.

    Args:
        tally: the run's spend, kept current by the ledger.
        max_cost_usd: USD cap, or None.
        max_total_tokens: prompt + completion tokens cap, or None.
        price_in / price_out: USD per million prompt / completion tokens without a reported cost.
        on_budget: ``drain`` (running prompts finish) or ``cancel`` (they are cancelled).

    Attributes:
        reached: True once a prompt was refused for the cap.
        spent_at_stop: the spend when the cap was reached (for the overshoot), or None.
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

    def allows(self, in_flight: int) -> bool:
        """Whether one more prompt may start with ``in_flight`` prompts running; O(1).

        The first refusal turns :attr:`reached` on and stops new attempts of this process
        (:func:`hermes_core.cancel.hold_new_prompts`: a retry that would start later ends
        without a trajectory and stays pending; prompts already admitted run); with
        ``on_budget=cancel`` it also cancels the running ones
        (:func:`hermes_core.cancel.cancel_running`, in a thread).
        """
        if not self.capped:
            return True
        if self.reached:
            return False
        spent = self.spent
        ahead = in_flight + 1  # the prompts running and this one, each expected to spend the mean
        share = ahead / spent.records if spent.records else 0.0
        ok = True
        if self.max_total_tokens is not None:
            ok = spent.total_tokens * (1 + share) <= self.max_total_tokens
        if ok and self.max_cost_usd is not None:
            ok = (self.cost or 0.0) * (1 + share) <= self.max_cost_usd
        if not ok:
            self._reach()
        return ok

    def _reach(self) -> None:
        self.reached = True
        self.spent_at_stop = (self.cost, self.spent.total_tokens)
        cancel.hold_new_prompts()
        if self.on_budget == "cancel":
            threading.Thread(target=cancel.cancel_running, name="hermes-budget-cancel", daemon=True).start()

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


__all__ = ["Budget", "cost_source", "projection"]
