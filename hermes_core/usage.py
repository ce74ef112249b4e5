"""Token usage and cost of model calls: the one type every usage is read into, summed and written as.

A usage is written, in rows (``metadata.usage``), discard tombstones and ledger lines (README §
Outputs), as ``{prompt_tokens, completion_tokens, reasoning_tokens, cost}``: tokens as integers,
``cost`` in USD as the provider reported it (rounded to 8 decimals) or null when it reported none.
:meth:`Usage.from_dict` reads that form, :meth:`Usage.as_dict` writes it, and ``+``
(:meth:`Usage.__add__`) is the one sum of two usages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class Usage:
    """Token usage (tokens) and cost (USD, only when the provider reports it) of one or more calls.

    Attributes:
        prompt_tokens / completion_tokens / reasoning_tokens: tokens (reasoning tokens are part of
            the completion tokens, as providers count them).
        cost: USD the provider reported, or None when no call summed here reported one.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None

    @property
    def total_tokens(self) -> int:
        """prompt + completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        """The sum of two usages: tokens added; ``cost`` None unless one of them has one."""
        if not isinstance(other, Usage):
            return NotImplemented
        costs = [c for c in (self.cost, other.cost) if c is not None]
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cost=sum(costs) if costs else None,
        )

    def add(self, other: Usage) -> None:
        """Accumulate ``other`` into this usage in place (``self + other``; for a live total)."""
        total = self + other
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(total, f.name))

    def copy(self) -> Usage:
        """A copy of this usage (a snapshot of a live total)."""
        return dataclasses.replace(self)

    @classmethod
    def total(cls, usages: Iterable[Usage | None]) -> Usage | None:
        """The sum of ``usages`` (None items skipped); None when there is none to sum."""
        result: Usage | None = None
        for usage in usages:
            if usage is not None:
                result = usage.copy() if result is None else result + usage
        return result

    def as_dict(self) -> dict[str, Any]:
        """``{prompt_tokens, completion_tokens, reasoning_tokens, cost}`` for the row's metadata."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cost": None if self.cost is None else round(self.cost, 8),
        }

    @classmethod
    def from_dict(cls, usage: Any) -> Usage:
        """Read a stored usage (the :meth:`as_dict` form that rows and ledger lines carry).

        None or not a dict: nothing spent. A count that is not a number counts 0 (a float counts
        its integer part); a ``cost`` that is not a number is None (not reported).
        """
        data = usage if isinstance(usage, dict) else {}
        cost = data.get("cost")
        return cls(
            prompt_tokens=_count(data.get("prompt_tokens")),
            completion_tokens=_count(data.get("completion_tokens")),
            reasoning_tokens=_count(data.get("reasoning_tokens")),
            cost=float(cost) if _is_number(cost) else None,
        )

    @classmethod
    def from_api(cls, usage: Any) -> Usage:
        """Read a response's ``usage`` (JSON dict or SDK ``CompletionUsage``; ``cost`` and reasoning tokens when present)."""
        if usage is None:
            return cls()
        data = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
        details = data.get("completion_tokens_details")
        details = details if isinstance(details, dict) else {}
        cost = data.get("cost")
        return cls(
            prompt_tokens=int(data.get("prompt_tokens") or 0),
            completion_tokens=int(data.get("completion_tokens") or 0),
            reasoning_tokens=int(details.get("reasoning_tokens") or 0),
            cost=float(cost) if isinstance(cost, int | float) else None,
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: Any) -> int:
    return int(value) if _is_number(value) else 0


__all__ = ["Usage"]
