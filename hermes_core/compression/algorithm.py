"""Compress one ShareGPT row to a token budget (the reference ``trajectory_compressor.py``'s algorithm).

A row (``conversations``: ``[{from: system|human|gpt|tool, value}]``) at or under
``target_max_tokens`` is untouched. Over it:

1. **Protected**: the head, every turn up to and including the first ``system``, ``human``,
   ``gpt`` and ``tool`` turn; and the last ``protect_last_n_turns`` turns.
2. **Region**: from the first unprotected turn (moved past ``tool`` turns, whose call is in the
   head), the fewest turns, oldest first, whose removal brings the row to the target once the
   summary turn (``summary_target_tokens`` + the prefix) and the notice are added. Its end is
   moved past ``tool`` turns, so a ``gpt`` turn holding ``<tool_call>`` stays with the ``tool``
   turn(s) holding its ``<tool_response>``; when that would reach into the protected tail, the end
   moves back before the call instead. A region no larger than the summary is not worth replacing.
3. The region becomes ONE ``human`` turn ``"[CONTEXT SUMMARY]: <summary>"``; with the notice on,
   the first system turn gains :data:`SUMMARY_NOTICE`.

Statuses: ``untouched`` (at or under the target), ``compressed`` (now at or under it),
``still_over`` (over it after compression, or nothing could be compressed), ``failed`` (the
summariser failed: the row is kept as it was), ``dropped`` (``still_over`` with
``drop_over_limit``; decided by the caller, :mod:`hermes_core.compression.batch`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from hermes_core.compression.summariser import SUMMARY_PREFIX, Summariser, SummariserError, SummaryResult
from hermes_core.compression.tokens import TokenCounter
from hermes_core.usage import Usage

__all__ = [
    "DEFAULT_TARGET_MAX_TOKENS",
    "HEAD_ROLES",
    "SUMMARY_NOTICE",
    "CompressionSettings",
    "RowResult",
    "assemble",
    "compress_row",
    "finish",
    "plan_region",
    "protected_bounds",
    "settings_key",
    "summary_input",
]

DEFAULT_TARGET_MAX_TOKENS = 15250
HEAD_ROLES = ("system", "human", "gpt", "tool")
"""The head is protected up to and including the first turn of each of these roles."""
SUMMARY_NOTICE = "\n\nSome earlier turns of this conversation, tool responses among them, may be summarised."
"""Appended to the system turn of a compressed row when ``summary_notice`` is on."""
_ELIDE_OVER, _KEEP_HEAD, _KEEP_TAIL = 3000, 1500, 500
"""A turn longer than 3,000 characters reaches the summariser as its first 1,500 and last 500."""


@dataclass(frozen=True)
class CompressionSettings:
    """What decides a compression (see the module docstring); tokens are the tokenizer's.

    Attributes:
        target_max_tokens: the budget of a row (sum of its turns' tokens).
        protect_last_n_turns: turns at the end never compressed.
        summary_target_tokens: the summary's length asked for (``max_tokens`` is twice it).
        summary_notice: add :data:`SUMMARY_NOTICE` to the system turn of a compressed row.
        summary_model: the summariser's model id (part of the cache key).
        drop_over_limit: leave rows still over the target out of the output.
        sample_percent: compress only a seeded sample of this share of the rows (0 < p <= 100), or None.
        seed: the sample's seed.
    """

    target_max_tokens: int = DEFAULT_TARGET_MAX_TOKENS
    protect_last_n_turns: int = 4
    summary_target_tokens: int = 750
    summary_notice: bool = True
    summary_model: str = ""
    drop_over_limit: bool = False
    sample_percent: float | None = None
    seed: int = 42


@dataclass
class RowResult:
    """One row's compression.

    Attributes:
        status: ``untouched``, ``compressed``, ``still_over`` or ``failed`` (module docstring).
        tokens_before / tokens_after, turns_before / turns_after: the row's size (after = before
            unless a summary replaced a region).
        turn_tokens: tokens of each turn before.
        region: ``(start, until)``: turns ``start .. until-1`` replaced (or planned, when failed), or None.
        summary: the summary text (without the prefix), or None.
        calls / errors / usage: the summariser's requests, failed requests and usage.
        error: why the summariser failed, or None.
        conversations: the new turns, or None when the row is unchanged.
    """

    status: str
    tokens_before: int
    tokens_after: int
    turns_before: int
    turns_after: int
    turn_tokens: list[int] = field(default_factory=list)
    region: tuple[int, int] | None = None
    summary: str | None = None
    calls: int = 0
    errors: int = 0
    usage: Usage | None = None
    error: str | None = None
    conversations: list[dict[str, Any]] | None = None


def settings_key(row_digest: str, tokenizer: str, settings: CompressionSettings) -> str:
    """sha256 (32 hex) of what decides a row's compressed result: the row's bytes' digest, the
    tokenizer's fingerprint, the target, ``protect_last_n_turns``, the summary model, its target and the notice."""
    blob = json.dumps(
        [
            row_digest,
            tokenizer,
            settings.target_max_tokens,
            settings.protect_last_n_turns,
            settings.summary_model,
            settings.summary_target_tokens,
            settings.summary_notice,
        ]
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def protected_bounds(turns: list[dict[str, Any]], protect_last_n_turns: int) -> tuple[int, int]:
    """``(head_end, tail_start)``: turns ``< head_end`` are the protected head, ``>= tail_start`` the tail."""
    first: dict[str, int] = {}
    for i, turn in enumerate(turns):
        first.setdefault(turn.get("from"), i)
    head_end = max((first[r] for r in HEAD_ROLES if r in first), default=-1) + 1
    return head_end, max(head_end, len(turns) - max(0, protect_last_n_turns))


def plan_region(
    turns: list[dict[str, Any]], turn_tokens: list[int], settings: CompressionSettings, added_tokens: int
) -> tuple[int, int] | None:
    """The region to summarise, ``(start, until)``, or None when no region can shrink the row.

    Args:
        turn_tokens: tokens of each turn.
        added_tokens: what compression adds: the summary turn's expected tokens and the notice's.
    """
    head_end, tail_start = protected_bounds(turns, settings.protect_last_n_turns)

    def is_tool(i: int) -> bool:
        return i < len(turns) and turns[i].get("from") == "tool"

    start = head_end
    while start < tail_start and is_tool(start):  # responses to a call in the head stay with it
        start += 1
    need = sum(turn_tokens) + added_tokens - settings.target_max_tokens
    taken, until = 0, start
    while until < tail_start and taken < need:
        taken += turn_tokens[until]
        until += 1
    while until < tail_start and is_tool(until):  # whole call/response pairs
        until += 1
    if is_tool(until):  # the tail starts with the responses: leave their call out of the region
        while until > start and is_tool(until):
            until -= 1
    if until <= start or sum(turn_tokens[start:until]) <= settings.summary_target_tokens:
        return None
    return start, until


def summary_input(turns: list[dict[str, Any]], start: int, until: int) -> str:
    """The text sent to the summariser: turns ``start .. until-1`` as ``[Turn i - ROLE]:`` blocks, long values elided."""
    parts = []
    for i in range(start, until):
        value = str(turns[i].get("value") or "")
        if len(value) > _ELIDE_OVER:
            cut = len(value) - _KEEP_HEAD - _KEEP_TAIL
            value = f"{value[:_KEEP_HEAD]}\n[... {cut} characters left out ...]\n{value[-_KEEP_TAIL:]}"
        parts.append(f"[Turn {i} - {str(turns[i].get('from', '?')).upper()}]:\n{value}")
    return "\n\n".join(parts)


def assemble(
    turns: list[dict[str, Any]], start: int, until: int, summary: str, notice: bool
) -> list[dict[str, Any]]:
    """The compressed turns: ``turns[:start]`` (the first system turn with the notice), the summary turn, ``turns[until:]``."""
    head = [dict(t) for t in turns[:start]]
    if notice:
        for turn in head:
            if turn.get("from") == "system":
                turn["value"] = f"{turn.get('value') or ''}{SUMMARY_NOTICE}"
                break
    return [*head, {"from": "human", "value": f"{SUMMARY_PREFIX} {summary}"}, *turns[until:]]


def _notice_tokens(turns: list[dict[str, Any]], head_end: int, counter: TokenCounter) -> tuple[int, int]:
    """(index of the system turn the notice goes to or -1, the tokens the notice adds to it)."""
    for i in range(head_end):
        if turns[i].get("from") == "system":
            value = turns[i].get("value") or ""
            return i, counter.count(f"{value}{SUMMARY_NOTICE}") - counter.count(value)
    return -1, 0


def compress_row(
    turns: list[dict[str, Any]],
    counter: TokenCounter,
    settings: CompressionSettings,
    summarise: Summariser,
    turn_tokens: list[int] | None = None,
) -> RowResult:
    """Compress one row's ``conversations`` (see the module docstring); ``turn_tokens`` when already counted.

    Raises:
        PromptCancelled: the summariser's spend guard refused a request (the caller stops).
    """
    counts = list(turn_tokens) if turn_tokens is not None else counter.count_turns(turns)
    total, n = sum(counts), len(turns)
    result = RowResult("untouched", total, total, n, n, counts)
    if total <= settings.target_max_tokens:
        return result
    result.status = "still_over"
    head_end, _ = protected_bounds(turns, settings.protect_last_n_turns)
    system, notice = _notice_tokens(turns, head_end, counter) if settings.summary_notice else (-1, 0)
    expected = counter.count(f"{SUMMARY_PREFIX} ") + settings.summary_target_tokens
    region = plan_region(turns, counts, settings, expected + notice)
    if region is None:
        return result
    start, until = region
    result.region = region
    try:
        answer = summarise(summary_input(turns, start, until), settings.summary_target_tokens)
    except SummariserError as exc:
        result.status, result.error = "failed", str(exc)
        result.calls, result.errors, result.usage = exc.calls, exc.errors, exc.usage
        return result
    answer = answer if isinstance(answer, SummaryResult) else SummaryResult(*answer)
    result.summary, result.usage, result.calls, result.errors = answer
    finish(result, turns, counter, settings, system)
    return result


def finish(
    result: RowResult,
    turns: list[dict[str, Any]],
    counter: TokenCounter,
    settings: CompressionSettings,
    system: int | None = None,
) -> None:
    """Fill ``result``'s new turns, their count and its status from its region and summary."""
    assert result.region is not None and result.summary is not None
    start, until = result.region
    new = assemble(turns, start, until, result.summary, settings.summary_notice)
    if system is None:
        system = next((i for i in range(start) if turns[i].get("from") == "system"), -1)
    tokens = result.tokens_before - sum(result.turn_tokens[start:until])
    tokens += counter.count(new[start]["value"])
    if settings.summary_notice and system >= 0:
        tokens += counter.count(new[system]["value"]) - result.turn_tokens[system]
    result.conversations = new
    result.tokens_after, result.turns_after = tokens, len(new)
    result.status = "compressed" if tokens <= settings.target_max_tokens else "still_over"
