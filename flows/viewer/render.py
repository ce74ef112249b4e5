"""Turn a trajectory row into what the trajectory page shows (plain data; the templates escape it).

Turns are parsed with :mod:`hermes_core.sharegpt_parse`; a turn that is not in the converter's
form is shown as its raw text with the parse error. JSON is pretty-printed with
``indent=2, ensure_ascii=False``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from hermes_core.sharegpt_parse import TurnFormatError, parse_gpt_turn, parse_system_tools, parse_tool_turn

__all__ = ["pretty", "row_facts", "score_views", "turn_views"]


def pretty(value: Any) -> str:
    """A JSON value pretty-printed; a string that is not JSON is returned as is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
        if isinstance(value, str):
            return value
    return json.dumps(value, indent=2, ensure_ascii=False)


def _turn_view(number: int, turn: Mapping[str, Any]) -> dict[str, Any]:
    kind = str(turn.get("from") or "?")
    value = str(turn.get("value") or "")
    view: dict[str, Any] = {"number": number, "kind": kind, "raw": value, "error": None}
    try:
        if kind == "system":
            view["tools"] = [t["name"] for t in parse_system_tools(value)]
        elif kind == "gpt":
            parsed = parse_gpt_turn(value)
            view["reasoning"] = parsed.reasoning
            view["content"] = parsed.content
            view["calls"] = [{"name": c.name, "arguments": pretty(c.arguments)} for c in parsed.calls]
        elif kind == "tool":
            view["responses"] = [
                {"name": r.name, "id": r.tool_call_id, "content": pretty(r.content)}
                for r in parse_tool_turn(value)
            ]
    except TurnFormatError as exc:
        view["error"] = str(exc)
    return view


def turn_views(conversations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One view per turn: ``{"number", "kind", "raw", "error"}`` plus, by kind, ``tools`` (names,
    system), ``reasoning``/``content``/``calls`` (``[{"name", "arguments"}]``, gpt) or
    ``responses`` (``[{"name", "id", "content"}]``, tool); ``error`` is the parse error, if any."""
    return [_turn_view(n, turn) for n, turn in enumerate(conversations)]


def row_facts(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The row's metadata as ``(label, text)`` pairs: model, time, batch, usage, cost, duration,
    stop reason, attempt, API calls, completed/partial, toolsets offered, tools called, source, prompt id
    and (with samples) the sample index."""
    meta = row.get("metadata") if isinstance(row.get("metadata"), Mapping) else {}
    usage = meta.get("usage") if isinstance(meta.get("usage"), Mapping) else {}
    cost = usage.get("cost")
    stats = row.get("tool_stats") if isinstance(row.get("tool_stats"), Mapping) else {}
    called = [
        f"{name} ×{s.get('count')} ({s.get('failure')} failed)"
        for name, s in stats.items()
        if isinstance(s, Mapping) and s.get("count")
    ]
    facts = [
        ("model", meta.get("model")),
        ("timestamp", meta.get("timestamp")),
        ("batch", meta.get("batch_num")),
        (
            "tokens",
            f"{usage.get('prompt_tokens')} prompt, {usage.get('completion_tokens')} completion, "
            f"{usage.get('reasoning_tokens')} reasoning",
        ),
        ("cost", "n/a" if cost is None else f"${cost:.6f}"),
        ("duration", None if meta.get("duration_s") is None else f"{meta.get('duration_s')} s"),
        ("stop reason", meta.get("stop_reason")),
        ("attempt", meta.get("attempt")),
        ("API calls", row.get("api_calls")),
        ("completed", f"{row.get('completed')} (false = the turn limit ended it)"),
        ("partial", row.get("partial")),
        ("toolsets offered", ", ".join(row.get("toolsets_used") or []) or "none"),
        ("tools called", ", ".join(called) or "none"),
        ("source", json.dumps(meta.get("source"), ensure_ascii=False)),
        ("prompt id", meta.get("prompt_id")),
    ]
    if meta.get("sample_index") is not None:  # --samples_per_prompt > 1
        facts.append(("sample", meta.get("sample_index")))
    return [(label, "" if value is None else str(value)) for label, value in facts]


def score_views(row: Mapping[str, Any], rescored: Collection[str] = ()) -> list[dict[str, Any]]:
    """The row's ``metadata.score`` as ``[{"scorer", "value", "passed", "explanation", "rescored"}]``
    in the row's order; ``rescored``: the scorers whose result comes from ``scores.jsonl``."""
    meta = row.get("metadata") if isinstance(row.get("metadata"), Mapping) else {}
    score = meta.get("score") if isinstance(meta.get("score"), Mapping) else {}
    return [
        {
            "scorer": name,
            "value": result.get("value"),
            "passed": result.get("passed"),
            "explanation": str(result.get("explanation") or ""),
            "rescored": name in rescored,
        }
        for name, result in score.items()
        if isinstance(result, Mapping)
    ]
