"""The summariser: writes the summary that replaces a compressed region of turns.

A summariser is any callable ``summarise(text, target_tokens)`` returning ``(summary, usage)``
(or a :class:`SummaryResult`, which adds the requests made and the failed ones), raising
:class:`SummariserError` when no summary can be had. :class:`ModelSummariser` is the real one: one
Chat Completions request through :class:`~hermes_core.client.ModelClient` (the client's retries,
the run's request limiter and spend guard when given), temperature 0.3, ``max_tokens`` twice the
target. There is no placeholder summary: a failure is a failure.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from hermes_core.usage import Usage

if TYPE_CHECKING:
    from hermes_core.limiter import ConcurrencyLimiter
    from hermes_core.settings import HermesSettings
    from hermes_core.spend_guard import RequestGuard

__all__ = [
    "SUMMARY_PREFIX",
    "SUMMARY_TEMPERATURE",
    "ModelSummariser",
    "Summariser",
    "SummariserError",
    "SummaryResult",
    "summary_messages",
]

SUMMARY_PREFIX = "[CONTEXT SUMMARY]:"
"""The summary turn's value starts with this, then a space and the summary."""
SUMMARY_TEMPERATURE = 0.3
"""Sampling temperature of the summary requests (the reference's)."""

_THINK = re.compile(r"<(think|REASONING_SCRATCHPAD)>.*?</\1>", re.DOTALL)


class SummaryResult(NamedTuple):
    """A summary and what it cost: ``summary`` text (no prefix), ``usage`` (tokens, USD),
    ``calls`` (HTTP requests made, retries included) and ``errors`` (those that failed)."""

    summary: str
    usage: Usage | None
    calls: int = 1
    errors: int = 0


class SummariserError(RuntimeError):
    """No summary after the retries (the provider failed, or the reply was empty or cut at ``max_tokens``).

    Attributes:
        calls / errors: requests made and requests that failed.
        usage: what the requests that were answered spent, or None.
    """

    def __init__(self, message: str, *, calls: int = 1, errors: int = 1, usage: Usage | None = None):
        super().__init__(message)
        self.calls = calls
        self.errors = errors
        self.usage = usage


class Summariser(Protocol):
    """``summarise(text, target_tokens) -> (summary, usage)`` or a :class:`SummaryResult`.

    Raises:
        SummariserError: no summary.
    """

    def __call__(self, text: str, target_tokens: int) -> tuple[str, Usage | None] | SummaryResult: ...


def summary_messages(text: str, target_tokens: int) -> list[dict[str, Any]]:
    """The Chat Completions messages asking for a summary of ``text`` (formatted turns) in about ``target_tokens``."""
    instructions = (
        "The turns below are the middle of an AI agent's conversation. They will be removed and your "
        "summary will stand in their place, so the conversation must still make sense without them.\n"
        "Write in the language of the turns. Say, from a neutral point of view, what the agent did (the "
        "tools it called and with what), what it found (results, values, file names, errors) and what "
        f"it decided. Be factual and dense; about {target_tokens} tokens. Reply with the summary only."
    )
    return [
        {"role": "system", "content": instructions},
        {"role": "user", "content": f"Turns to summarise:\n\n{text}"},
    ]


class _Counting:
    """A request guard that counts the requests of one summary and passes both calls on to the run's guard."""

    def __init__(self, inner: RequestGuard | None):
        self.inner = inner
        self.calls = 0
        self.answered = 0
        self.usage = Usage()
        self._lock = threading.Lock()

    def before_request(self) -> None:
        with self._lock:
            self.calls += 1
        if self.inner is not None:
            self.inner.before_request()

    def after_request(self, usage: Usage) -> None:
        with self._lock:
            self.answered += 1
            self.usage.add(usage)
        if self.inner is not None:
            self.inner.after_request(usage)


class ModelSummariser:
    """The summariser over an OpenAI-compatible endpoint (see the module docstring).

    Args:
        model: the summary model's id (``mock/summariser`` is the offline mock).
        base_url: its endpoint (None: the mock server for ``mock/`` ids, else the settings' endpoint).
        settings: key, request timeout and retries (default: from the environment).
        limiter / guard: the run's request limiter and spend cap, or None.

    Raises:
        ConfigError: no API key for a remote endpoint (checked here, before any work).
        PromptCancelled: (on call) the guard refused a request (the spend cap is reached).
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        settings: HermesSettings | None = None,
        *,
        limiter: ConcurrencyLimiter | None = None,
        guard: RequestGuard | None = None,
    ):
        from hermes_core.settings import HermesSettings

        self.model = model
        self.base_url = base_url
        self.settings = settings or HermesSettings()
        self.limiter = limiter
        self.guard = guard
        self._client(0, None)  # the endpoint resolves and has a key (the mock server starts)

    def _client(self, target_tokens: int, guard: RequestGuard | None):
        from hermes_core.client import side_client

        client = side_client(
            self.model,
            self.base_url,
            self.settings,
            max_tokens=max(16, 2 * target_tokens),
            temperature=SUMMARY_TEMPERATURE,
            limiter=self.limiter,
            guard=guard,
        )
        self.base_url = client.base_url  # resolved once: a mock/ id's server started once
        return client

    def __call__(self, text: str, target_tokens: int) -> SummaryResult:
        """One summary of ``text`` in about ``target_tokens`` (see :class:`Summariser`)."""
        from hermes_core.exceptions import ModelError

        counting = _Counting(self.guard)
        client = self._client(target_tokens, counting)
        try:
            turn = client.complete(summary_messages(text, target_tokens), [])
        except ModelError as exc:
            failed = counting.calls - counting.answered
            raise SummariserError(
                f"{self.model}: {exc}", calls=counting.calls, errors=failed, usage=_or_none(counting.usage)
            ) from None
        calls, errors = counting.calls, counting.calls - 1
        usage = _or_none(counting.usage)
        if turn.message.get("finish_reason") == "length":
            raise SummariserError(
                f"{self.model}: the summary was cut at max_tokens ({2 * target_tokens})",
                calls=calls,
                errors=errors + 1,
                usage=usage,
            )
        summary = _THINK.sub("", turn.message.get("content") or "").strip()
        if summary.startswith(SUMMARY_PREFIX):
            summary = summary[len(SUMMARY_PREFIX) :].strip()
        if not summary:
            raise SummariserError(f"{self.model}: empty summary", calls=calls, errors=errors + 1, usage=usage)
        return SummaryResult(summary, usage, calls, errors)


def _or_none(usage: Usage) -> Usage | None:
    return usage if usage.total_tokens or usage.cost else None
