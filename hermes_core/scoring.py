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
* ``judge``: an LLM judge (``--judge_model``, default the run's model; ``--judge_base_url``,
  default the run's endpoint) reads the task, the record's ``answer`` when it has one and the
  agent's final answer under a rubric (``--judge_rubric_file``, default :data:`JUDGE_RUBRIC`) and
  answers ``PASS`` or ``FAIL`` with a reason (:func:`judge_messages`, :func:`read_verdict`). Its
  requests go through the run's limiter and spend cap and its usage counts in the row's. A judge
  request that fails after its retries makes the sample errored (:class:`ScorerError`).
* ``python:module:function``: ``function(row, record)`` of an importable module (the current
  folder is tried too) returns ``{"value": float, "passed": bool, "explanation": str}``
  (``value`` defaults to 1.0/0.0 by ``passed``); ``row`` is the trajectory row being written,
  ``record`` the dataset record (``prompt`` and its other fields). A function that raises or
  returns something else gives ``passed: false`` with ``"errored": true`` and the error as the
  explanation: the paid trajectory is kept, and ``hermes-batch score`` can score it again once
  the function is fixed.

``judge`` and ``python:`` scorers apply to every record; ``answer`` and ``verify`` only to records
with that field. Each result is ``{"value": float, "passed": bool, "explanation": str}`` and goes
to the row's ``metadata.score[<scorer>]``; ``metadata.passed`` is true when every applied scorer
passed.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hermes_core.exceptions import ModelError, ScorerError

if TYPE_CHECKING:
    from hermes_core.client import ModelClient
    from hermes_core.environments import Environment
    from hermes_core.usage import Usage

SCORERS = ("auto", "answer", "verify", "judge")
"""Names ``--scorer`` accepts, besides ``python:module:function``."""
PYTHON_PREFIX = "python:"
"""Prefix of a user's scorer function, ``python:module:function``."""
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
    """``names`` without duplicates, in order; ``[]`` means ``["auto"]``. A ``python:`` scorer is imported to check it.

    Raises:
        ValueError: a name is neither one of :data:`SCORERS` nor a loadable ``python:module:function``
            (the message says which and why).
    """
    for name in names:
        if name.startswith(PYTHON_PREFIX):
            load_python_scorer(name)
        elif name not in SCORERS:
            raise ValueError(
                f"unknown scorer {name!r} (choose from {', '.join(SCORERS)}, or python:module:function)"
            )
    return list(dict.fromkeys(names)) or ["auto"]


def load_python_scorer(name: str) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    """The function a ``python:module:function`` scorer names (the current folder is searched too).

    Raises:
        ValueError: the name is malformed, the module cannot be imported, or it has no such callable.
    """
    module_name, _, function_name = name.removeprefix(PYTHON_PREFIX).rpartition(":")
    if not module_name or not function_name:
        raise ValueError(f"scorer {name!r}: write it as python:module:function")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0] or os.getcwd() in sys.path:
            raise ValueError(f"scorer {name!r}: cannot import {module_name!r}: {exc}") from None
        sys.path.append(os.getcwd())  # a scorer module beside the dataset, as a user expects
        try:
            module = importlib.import_module(module_name)
        except ImportError as again:
            raise ValueError(f"scorer {name!r}: cannot import {module_name!r}: {again}") from None
    except Exception as exc:  # the user's module raised while importing
        raise ValueError(f"scorer {name!r}: importing {module_name!r} raised {exc!r}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"scorer {name!r}: {module_name} has no function {function_name!r}")
    return function


def score_python(name: str, row: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """A ``python:module:function`` scorer's result for ``row`` of ``record`` (see the module docstring)."""
    try:
        given = load_python_scorer(name)(row, record)
        passed = given["passed"]
        if not isinstance(passed, bool):
            raise TypeError(f"'passed' must be a bool, not {type(passed).__name__}")
        value = float(given.get("value", 1.0 if passed else 0.0))
        explanation = given.get("explanation", "")
        return {"value": value, "passed": passed, "explanation": str(explanation)[:VERIFY_EXPLANATION_CHARS]}
    except Exception as exc:  # the user's function: its bug must not lose the paid trajectory
        what = f"{type(exc).__name__}: {exc}"[:VERIFY_EXPLANATION_CHARS]
        return {"value": 0.0, "passed": False, "explanation": f"scorer error: {what}", "errored": True}


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
    """The scorers that apply to ``record``, in order: ``auto`` resolved, ``answer`` / ``verify`` left
    out when the record lacks that field (``judge`` and ``python:`` scorers always apply)."""
    applied: list[str] = []
    for name in requested:
        if name == "auto":
            name = "verify" if record.get("verify") else "answer" if record.get("answer") else None
        needs_field = name in ("answer", "verify")
        if name and (record.get(name) or not needs_field) and name not in applied:
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


JUDGE_RUBRIC = """You grade the final answer an AI agent gave to a task.
When a reference answer is given, PASS only if the final answer states the same result (wording,
formatting and extra explanation do not matter; a different or missing result fails).
When no reference answer is given, PASS only if the final answer correctly and completely does
what the task asks."""
"""The judge's default rubric (``--judge_rubric_file`` replaces it)."""
JUDGE_REPLY_RULE = "Reply with PASS or FAIL on the first line, then one short sentence giving the reason."
"""Appended to every rubric: the reply form :func:`read_verdict` reads."""
JUDGE_MAX_TOKENS = 300
"""The judge's token limit per reply."""
_VERDICT = re.compile(r"^\W*(?:verdict\W*)?(PASS|FAIL)\b", re.IGNORECASE)


def judge_messages(task: str, final_text: str | None, answer: Any, rubric: str) -> list[dict[str, str]]:
    """The judge's Chat Completions messages: the rubric as the system turn, the case as the user turn.

    ``answer`` (the record's, a string or a list of accepted strings, or None) is shown as the
    reference; the task and the final answer are quoted as they are (reasoning blocks removed).
    """
    accepted = answer if isinstance(answer, list) else [answer] if answer else []
    reference = " | ".join(str(a) for a in accepted) if accepted else "(none given)"
    final = _THINK.sub("", final_text or "").strip() or "(no final answer)"
    case = f"## Task\n{task}\n\n## Reference answer\n{reference}\n\n## Final answer of the agent\n{final}\n"
    return [
        {"role": "system", "content": f"{rubric.strip()}\n\n{JUDGE_REPLY_RULE}"},
        {"role": "user", "content": case},
    ]


def read_verdict(reply: str | None) -> dict[str, Any]:
    """The judge's result from its reply: PASS or FAIL opening the first non-empty line, the rest the reason.

    A reply without a verdict fails, saying so (a judge that cannot decide does not pass a sample).
    """
    text = _THINK.sub("", reply or "").strip()
    match = _VERDICT.match(text)
    if not match:
        return {"value": 0.0, "passed": False, "explanation": f"the judge gave no verdict: {text[:300]!r}"}
    passed = match.group(1).upper() == "PASS"
    reason = text[match.end() :].lstrip(" *_:.-\n").strip() or match.group(1).upper()
    return {
        "value": 1.0 if passed else 0.0,
        "passed": passed,
        "explanation": reason[:VERIFY_EXPLANATION_CHARS],
    }


def score_judge(
    client: ModelClient,
    task: str,
    final_text: str | None,
    answer: Any,
    rubric: str | None = None,
    *,
    deadline: float | None = None,
) -> tuple[dict[str, Any], Usage]:
    """The ``judge`` scorer: one request to ``client`` (its limiter, retries and spend cap apply).

    Returns:
        (the result, the judge request's usage).

    Raises:
        ScorerError: the request failed after its retries (the sample is errored, not failed).
        PromptCancelled: the run stopped or its spend cap was reached before the request.
    """
    messages = judge_messages(task, final_text, answer, rubric or JUDGE_RUBRIC)
    try:
        turn = client.complete(messages, [], deadline=deadline)
    except ModelError as exc:
        raise ScorerError(f"the judge's request failed: {exc}", retryable=exc.retryable) from None
    return read_verdict(turn.message.get("content")), turn.usage


def describe_scores(scores: dict[str, dict[str, Any]]) -> str:
    """One line of a run's ``statistics.json`` ``scores``, e.g. ``answer 1/2 passed (mean 0.5) · verify 3/3 passed (mean 1)``; empty when none."""
    return " · ".join(
        f"{name} {s['passed']}/{s['scored']} passed (mean {s['mean']:g})" for name, s in scores.items()
    )


def describe_pass_at_k(pass_at_k: dict[str, float], pass_hat_k: float | None = None) -> str:
    """One line of a run's ``pass_at_k`` / ``pass_hat_k``, e.g. ``pass@1 0.6429 · pass@4 0.7143 · pass^4 0.5``; empty when none."""
    parts = [f"pass@{k} {value:g}" for k, value in pass_at_k.items()]
    if pass_hat_k is not None and len(pass_at_k) > 1:
        parts.append(f"pass^{list(pass_at_k)[-1]} {pass_hat_k:g}")
    return " · ".join(parts)


__all__ = [
    "describe_pass_at_k",
    "describe_scores",
    "DEFAULT_VERIFY_TIMEOUT",
    "KEEP_CHOICES",
    "SCORERS",
    "applied_scorers",
    "check_record_fields",
    "check_scorers",
    "JUDGE_MAX_TOKENS",
    "JUDGE_REPLY_RULE",
    "JUDGE_RUBRIC",
    "PYTHON_PREFIX",
    "final_answers",
    "judge_messages",
    "load_python_scorer",
    "read_verdict",
    "score_judge",
    "score_python",
    "normalise_answer",
    "score_answer",
    "score_verify",
]
