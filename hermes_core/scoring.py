"""Scoring a trajectory against its record: the ``answer`` and ``verify`` scorers.

A record may carry an expected ``answer`` (a string, or a list of accepted strings) and a
``verify`` shell command. The scorers a run applies are named by ``--scorer`` (a comma list,
default ``auto``):

* ``auto``: ``verify`` when the record has it, else ``answer`` when it has that, else nothing;
* ``answer``: the final answer matches one of the accepted strings after :func:`normalise_answer`
  (case, runs of whitespace, and punctuation or quotes around the text do not count). The final
  answer is the last assistant turn's text; when that text has a line ``ANSWER: ...``, the last
  such line counts as the answer too (either match passes);
* ``verify``: the command runs in the prompt's own sandbox after the agent has finished and
  before the sandbox is torn down (same folder, files and image as the agent); exit status 0
  passes. It runs under ``--verify_timeout`` seconds; its output is bounded like a tool result's
  and kept (redacted, as every stored text) in the explanation.

A scorer named for a record that lacks its field is not applied to that record. Each result is
``{"value": float, "passed": bool, "explanation": str}`` (value 1.0 or 0.0 here) and goes to the
row's ``metadata.score[<scorer>]``; ``metadata.passed`` is true when every applied scorer passed.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_core.environments import Environment

SCORERS = ("auto", "answer", "verify")
"""Names ``--scorer`` accepts."""
KEEP_CHOICES = ("all", "passed", "best")
"""The merge's filters by score (``--keep``): every row; rows with ``metadata.passed`` true; per
record (prompt_index), the row with the highest mean score, ties to the fewest ``api_calls``, then
to the first written (:func:`hermes_core.runfolder.postprocess.merge_trajectories`)."""
DEFAULT_VERIFY_TIMEOUT = 120.0
"""Seconds a ``verify`` command may run (``--verify_timeout``)."""
VERIFY_EXPLANATION_CHARS = 2000
"""Characters of a ``verify`` command's output kept in its explanation (its head and tail)."""

_ANSWER_LINE = re.compile(r"^\s*answer\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)
_THINK = re.compile(r"<(think|REASONING_SCRATCHPAD)>.*?</\1>", re.DOTALL)
_EDGE_SYMBOLS = frozenset("`~$^|<>=+*_ ")
"""Symbols people put around an answer (markdown emphasis, code, math), besides punctuation."""


def check_scorers(names: list[str]) -> list[str]:
    """``names`` without duplicates, in order; ``[]`` means ``["auto"]``.

    Raises:
        ValueError: a name is not one of :data:`SCORERS` (the message lists them).
    """
    unknown = [name for name in names if name not in SCORERS]
    if unknown:
        raise ValueError(f"unknown scorer {unknown[0]!r} (choose from {', '.join(SCORERS)})")
    return list(dict.fromkeys(names)) or ["auto"]


def check_record_fields(record: dict[str, Any]) -> str | None:
    """Why a record's ``answer`` / ``verify`` is invalid, or None (absent or null is valid).

    ``answer``: a non-empty string, or a non-empty list of non-empty strings; ``verify``: a
    non-empty string.
    """
    answer = record.get("answer")
    if answer is not None:
        accepted = answer if isinstance(answer, list) else [answer]
        if not accepted:
            return "'answer' is an empty list"
        for item in accepted:
            if not isinstance(item, str):
                return "'answer' must be a string or a list of strings"
            if not item.strip():
                return "'answer' holds an empty string"
    verify = record.get("verify")
    if verify is not None:
        if not isinstance(verify, str):
            return "'verify' must be a string (a shell command)"
        if not verify.strip():
            return "'verify' is empty"
    return None


def applied_scorers(requested: list[str], record: dict[str, Any]) -> list[str]:
    """The scorers that apply to ``record``, in order: ``auto`` resolved, those lacking their field left out."""
    applied: list[str] = []
    for name in requested:
        if name == "auto":
            name = "verify" if record.get("verify") else "answer" if record.get("answer") else None
        if name and record.get(name) and name not in applied:
            applied.append(name)
    return applied


def normalise_answer(text: str) -> str:
    """``text`` compared case-insensitively: NFKC, casefolded, whitespace runs as one space, edge punctuation off.

    >>> normalise_answer('  "Paris."  ')
    'paris'
    >>> normalise_answer("**42**")
    '42'
    """
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    start, end = 0, len(text)
    while start < end and _at_edge(text[start]):
        start += 1
    while end > start and _at_edge(text[end - 1]):
        end -= 1
    return text[start:end]


def _at_edge(char: str) -> bool:
    """True for what :func:`normalise_answer` strips at the ends: punctuation of any script, and :data:`_EDGE_SYMBOLS`."""
    return char in _EDGE_SYMBOLS or unicodedata.category(char).startswith("P")


def final_answers(final_text: str) -> list[str]:
    """The candidate answers of a final turn: the whole text (reasoning blocks removed) and its last ``ANSWER:`` line."""
    text = _THINK.sub("", final_text).strip()
    candidates = [text]
    lines = _ANSWER_LINE.findall(text)
    if lines:
        candidates.append(lines[-1])
    return candidates


def score_answer(final_text: str | None, answer: str | list[str]) -> dict[str, Any]:
    """The ``answer`` scorer: 1.0 when a candidate of :func:`final_answers` matches an accepted answer."""
    accepted = answer if isinstance(answer, list) else [answer]
    wanted = {normalise_answer(a) for a in accepted}
    if not final_text or not final_text.strip():
        return {"value": 0.0, "passed": False, "explanation": "no final answer"}
    candidates = final_answers(final_text)
    for candidate in candidates:
        if normalise_answer(candidate) in wanted:
            return {"value": 1.0, "passed": True, "explanation": f"matches {candidate.strip()[:200]!r}"}
    shown = candidates[-1].strip()
    return {
        "value": 0.0,
        "passed": False,
        "explanation": f"{shown[:200]!r} is not one of {accepted[:5]!r}",
    }


def score_verify(env: Environment, command: str, timeout: float) -> dict[str, Any]:
    """The ``verify`` scorer: run ``command`` in the prompt's sandbox ``env``; exit 0 passes.

    Raises:
        SandboxError: the sandbox is gone (an infrastructure failure, retried like one).
    """
    result = env.execute(command, timeout=timeout)
    output = result.output
    if len(output) > VERIFY_EXPLANATION_CHARS:
        half = VERIFY_EXPLANATION_CHARS // 2
        output = output[:half] + "\n[...]\n" + output[-half:]
    if result.timed_out:
        why = f"timed out after {timeout:g} s"
    else:
        why = f"exit {result.returncode}"
    explanation = why + (f": {output.strip()}" if output.strip() else "")
    passed = result.returncode == 0 and not result.timed_out
    return {"value": 1.0 if passed else 0.0, "passed": passed, "explanation": explanation}


def describe_scores(scores: dict[str, dict[str, Any]]) -> str:
    """One line of a run's ``statistics.json`` ``scores``, e.g. ``answer 1/2 passed (mean 0.5) · verify 3/3 passed (mean 1)``; empty when none."""
    return " · ".join(
        f"{name} {s['passed']}/{s['scored']} passed (mean {s['mean']:g})" for name, s in scores.items()
    )


__all__ = [
    "describe_scores",
    "DEFAULT_VERIFY_TIMEOUT",
    "KEEP_CHOICES",
    "SCORERS",
    "applied_scorers",
    "check_record_fields",
    "check_scorers",
    "final_answers",
    "normalise_answer",
    "score_answer",
    "score_verify",
]
