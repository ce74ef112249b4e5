"""ShareGPT trajectory conversion, reasoning extraction and tool statistics (README § Outputs).

Pure functions over the agent's conversation: a list of OpenAI-format message
dicts as the agent loop builds them (the ephemeral system prompt and prefill
messages are not part of it)::

    {"role": "user", "content": str}
    {"role": "assistant", "content": str | None, "reasoning": str | None,
     "tool_calls": [{"id": str, "type": "function",
                     "function": {"name": str, "arguments": str}}],   # key optional
     "finish_reason": str | None}
    {"role": "tool", "tool_call_id": str, "name": str, "content": str}

:func:`to_sharegpt` turns it into ``[{"from": "system"|"human"|"gpt"|"tool", "value": str}]``;
:func:`tool_statistics` and :func:`reasoning_counts` compute the row's statistics.
All JSON is written with ``ensure_ascii=False`` and default separators.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "extract_reasoning",
    "timestamp_now",
    "has_reasoning",
    "hermes_system_prompt",
    "hermes_tool_entries",
    "is_tool_failure",
    "reasoning_counts",
    "split_inline_reasoning",
    "to_sharegpt",
    "tool_statistics",
]

_INLINE_BLOCK = re.compile(
    r"<(think|REASONING_SCRATCHPAD)>(.*?)</\1>",
    re.DOTALL | re.IGNORECASE,
)
_SCRATCHPAD_OPEN = re.compile(r"<REASONING_SCRATCHPAD>", re.IGNORECASE)
_SCRATCHPAD_CLOSE = re.compile(r"</REASONING_SCRATCHPAD>", re.IGNORECASE)
_NO_JSON = object()


def timestamp_now() -> str:
    """Current UTC time, ISO-8601 to the second, no offset: the reference's row ``timestamp`` shape."""
    return datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _parse_json(text: str) -> Any:
    """``json.loads(text)``, or :data:`_NO_JSON` when text is not strict JSON (NaN/Infinity rejected)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return _NO_JSON


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def extract_reasoning(message: Mapping[str, Any]) -> str | None:
    """Native reasoning of an assistant message, or None.

    Looks at, in order, ``reasoning`` (str), ``reasoning_content`` (str) and
    ``reasoning_details`` (list of ``{"type": ..., "text" | "summary": str, ...}``
    as OpenRouter sends them; the texts are joined with ``"\\n"``, entries without
    text such as ``reasoning.encrypted`` are skipped). The first one that is
    non-empty after stripping wins. Works on our message dicts and on the openai
    SDK's ``model_dump()`` of a message. Inline ``<think>`` blocks in the content
    are not looked at (see :func:`split_inline_reasoning`).

    Returns:
        The stripped reasoning text, or None when there is none.
    """
    for key in ("reasoning", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    details = message.get("reasoning_details")
    if isinstance(details, Sequence) and not isinstance(details, str):
        texts: list[str] = []
        for item in details:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, Mapping):
                text = item.get("text") or item.get("summary")
                if isinstance(text, str):
                    texts.append(text)
        joined = "\n".join(t for t in texts if t.strip()).strip()
        if joined:
            return joined
    return None


def split_inline_reasoning(content: str | None) -> tuple[str | None, str]:
    """Split ``<think>`` / ``<REASONING_SCRATCHPAD>`` blocks out of message content.

    Every closed block (tag names matched case-insensitively) is removed from the
    content, wherever it sits; the stripped texts of the non-empty ones are joined
    with ``"\\n"`` in order of appearance.

    Args:
        content: assistant message content; None is treated as ``""``.

    Returns:
        ``(reasoning, rest)``: the reasoning text, or None when no block has
        text, and the content without the blocks, stripped.
    """
    if not content:
        return None, ""
    texts = [m.group(2).strip() for m in _INLINE_BLOCK.finditer(content)]
    rest = _INLINE_BLOCK.sub("", content).strip()
    reasoning = "\n".join(t for t in texts if t)
    return (reasoning or None), rest


def has_reasoning(message: Mapping[str, Any]) -> bool:
    """True when an assistant message has native reasoning or a non-empty inline reasoning block."""
    if extract_reasoning(message) is not None:
        return True
    content = message.get("content")
    return isinstance(content, str) and split_inline_reasoning(content)[0] is not None


def hermes_tool_entries(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The system turn's ``<tools>`` entries: the reference's flattened structure (README § Outputs).

    Args:
        tools: the OpenAI ``tools`` entries offered to the model
            (``{"type": "function", "function": {"name", "description", "parameters"}}``).

    Returns:
        One ``{"name": str, "description": str, "parameters": dict, "required": None}`` per
        tool, keys in that order, in the given order (a missing description is ``""``, missing
        parameters ``{}``; ``required`` is always None, as the reference writes it).
    """
    entries = []
    for tool in tools:
        function = tool.get("function") or {}
        entries.append(
            {
                "name": function.get("name"),
                "description": function.get("description", ""),
                "parameters": function.get("parameters", {}),
                "required": None,
            }
        )
    return entries


def hermes_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The Hermes function-calling system message that opens every trajectory.

    Args:
        tools: the OpenAI ``tools`` entries offered to the model
            (``{"type": "function", "function": {"name", "description", "parameters"}}``),
            listed in the given order as one JSON array of :func:`hermes_tool_entries`
            inside ``<tools>`` ... ``</tools>`` (``[]`` when no tool is offered).

    Returns:
        The message text; the same input always gives the same text.
    """
    tools_json = _dumps(hermes_tool_entries(tools))
    return (
        "You are a function-calling AI model. The functions you can call are described "
        "as JSON signatures inside the <tools> </tools> XML tags below. Call one or more "
        "of them when they help with the user's request; when none is relevant, answer "
        "in plain conversational language. Do not guess argument values.\n"
        f"<tools>\n{tools_json}\n</tools>\n"
        "To call a function, write a JSON object with the function's name and its "
        'arguments, {"name": <function-name>, "arguments": <arguments-object>}, inside '
        "<tool_call> </tool_call> XML tags, one block per call:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call>\n'
        "Each function's result is returned to you inside <tool_response> </tool_response> XML tags."
    )


def _rename_scratchpad(content: str) -> str:
    return _SCRATCHPAD_CLOSE.sub("</think>", _SCRATCHPAD_OPEN.sub("<think>", content))


def _parse_arguments(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    parsed = _parse_json(arguments)
    return arguments if parsed is _NO_JSON else parsed


def _gpt_value(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    reasoning = extract_reasoning(message)
    if reasoning is None:
        reasoning, content = split_inline_reasoning(content)
    else:
        content = content.strip()
    content = _rename_scratchpad(content)
    value = f"<think>\n{reasoning}\n</think>\n" if reasoning else "<think>\n</think>\n"
    if content:
        value += content + "\n"
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        payload = {"name": function.get("name"), "arguments": _parse_arguments(function.get("arguments"))}
        value += f"<tool_call>\n{_dumps(payload)}\n</tool_call>\n"
    return value.rstrip()


def _tool_block(message: Mapping[str, Any], call_names: Mapping[str, str]) -> str:
    call_id = message.get("tool_call_id")
    content = message.get("content")
    if isinstance(content, str):
        parsed = _parse_json(content)
        content = content if parsed is _NO_JSON else parsed
    name = message.get("name") or call_names.get(call_id)
    payload = {"tool_call_id": call_id, "name": name, "content": content}
    return f"<tool_response>\n{_dumps(payload)}\n</tool_response>"


def to_sharegpt(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Convert the agent's conversation to ShareGPT turns (README § Outputs).

    Turns: ``system`` (:func:`hermes_system_prompt` of ``tools``), then per message
    ``human`` (user), ``gpt`` (assistant: ``<think>\\n{reasoning}\\n</think>\\n``,
    empty think block when there is no reasoning, then the content with
    ``<REASONING_SCRATCHPAD>`` renamed to ``think``, then one
    ``<tool_call>\\n{"name", "arguments"}\\n</tool_call>`` per call, trailing whitespace
    stripped) and ``tool`` (a run of consecutive tool messages becomes one turn of
    ``<tool_response>\\n{"tool_call_id", "name", "content"}\\n</tool_response>``
    blocks joined by ``"\\n"``). Arguments and tool contents are parsed as JSON when
    they are JSON and kept as the raw string otherwise. ``system`` messages in
    ``messages`` are skipped: the ephemeral system prompt never appears.

    Args:
        messages: the conversation (shapes in the module docstring).
        tools: the OpenAI ``tools`` entries offered to the model.

    Returns:
        ``[{"from": str, "value": str}, ...]``.

    Raises:
        ValueError: a message has a role other than system, user, assistant or tool.
    """
    call_names = {
        call.get("id"): (call.get("function") or {}).get("name")
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or ()
    }
    turns: list[dict] = [{"from": "system", "value": hermes_system_prompt(tools)}]
    pending_tools: list[str] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            pending_tools.append(_tool_block(message, call_names))
            continue
        if pending_tools:
            turns.append({"from": "tool", "value": "\n".join(pending_tools)})
            pending_tools = []
        if role == "user":
            content = message.get("content")
            turns.append({"from": "human", "value": content if content is not None else ""})
        elif role == "assistant":
            turns.append({"from": "gpt", "value": _gpt_value(message)})
        elif role != "system":
            raise ValueError(f"unknown message role {role!r} (expected user, assistant or tool)")
    if pending_tools:
        turns.append({"from": "tool", "value": "\n".join(pending_tools)})
    return turns


def _text_fails(text: str) -> bool:
    stripped = text.strip()
    return not stripped or stripped.lower().startswith("error:")


def is_tool_failure(content: str | None) -> bool:
    """Classify one tool result string (README § Outputs).

    A JSON object fails when it has a non-null ``error`` at top level or inside a
    ``content`` object, or ``success: false``; a non-zero ``exit_code`` alone is
    not a failure. A JSON string is judged by the non-JSON rule on its decoded
    text; other JSON values (arrays, numbers, booleans, null) succeed. A non-JSON
    result fails when it is empty after stripping or starts with ``error:``
    (case-insensitive); None counts as empty.
    """
    if content is None:
        return True
    parsed = _parse_json(content)
    if parsed is _NO_JSON:
        return _text_fails(content)
    if isinstance(parsed, str):
        return _text_fails(parsed)
    if not isinstance(parsed, dict):
        return False
    if parsed.get("error") is not None or parsed.get("success") is False:
        return True
    inner = parsed.get("content")
    return isinstance(inner, dict) and inner.get("error") is not None


def tool_statistics(
    messages: Sequence[Mapping[str, Any]], all_tools: Sequence[str]
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Per-tool call counts of a conversation.

    Each call in an assistant message's ``tool_calls`` counts under its function
    name; it succeeds or fails by :func:`is_tool_failure` of the tool message with
    the same ``tool_call_id``, and a call without a result fails. Names outside
    ``all_tools`` (hallucinated tools) are counted under their own name.

    Args:
        messages: the conversation (shapes in the module docstring).
        all_tools: every tool name of the registry; each gets a zero-filled entry.

    Returns:
        ``(tool_stats, tool_error_counts)``: ``{tool: {"count", "success", "failure"}}``
        and ``{tool: failures}``, both with keys sorted over ``all_tools`` plus the
        called names.
    """
    results: dict[Any, Any] = {}
    for m in messages:
        if m.get("role") == "tool":
            results.setdefault(m.get("tool_call_id"), m.get("content"))
    counts: dict[str, dict[str, int]] = {name: {"count": 0, "success": 0, "failure": 0} for name in all_tools}
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or ():
            name = (call.get("function") or {}).get("name") or ""
            entry = counts.setdefault(name, {"count": 0, "success": 0, "failure": 0})
            entry["count"] += 1
            call_id = call.get("id")
            failed = call_id not in results or is_tool_failure(results[call_id])
            entry["failure" if failed else "success"] += 1
    tool_stats = {name: counts[name] for name in sorted(counts)}
    tool_error_counts = {name: entry["failure"] for name, entry in tool_stats.items()}
    return tool_stats, tool_error_counts


def reasoning_counts(messages: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """``(assistant_turns, turns_with_reasoning)`` of a conversation (see :func:`has_reasoning`)."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    return len(assistant), sum(1 for m in assistant if has_reasoning(m))
