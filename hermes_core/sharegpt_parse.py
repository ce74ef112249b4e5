"""Read ShareGPT trajectory turns back into their parts: the inverse of :mod:`hermes_core.trajectory`.

One parser for everything that looks inside a row (the viewer, the ``messages`` export):

* :func:`parse_system_tools` - the tool entries listed inside ``<tools>`` ... ``</tools>``;
* :func:`parse_gpt_turn` - a ``gpt`` value: the leading ``<think>`` block, the content, the
  trailing ``<tool_call>`` blocks;
* :func:`parse_tool_turn` - a ``tool`` value: its ``<tool_response>`` blocks;
* :func:`to_chat_messages` - a whole ``conversations`` list as OpenAI chat ``messages`` plus the
  ``tools`` list (the form chat trainers take).

Every function raises :class:`TurnFormatError` when a value is not in the form
:func:`hermes_core.trajectory.to_sharegpt` writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GptTurn",
    "ToolCall",
    "ToolResponse",
    "TurnFormatError",
    "parse_gpt_turn",
    "parse_system_tools",
    "parse_tool_turn",
    "to_chat_messages",
]

_TOOLS_RE = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_THINK_RE = re.compile(r"\A<think>\n(?:(.*?)\n)?</think>(?:\n|\Z)", re.DOTALL)
# the tool calls close a gpt value: "<tool_call>\n{json}\n</tool_call>" blocks joined by "\n"
_CALLS_RE = re.compile(r"(?:\A|\n)(<tool_call>\n.*\n</tool_call>)\Z", re.DOTALL)
_CALL_RE = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_RESPONSE_RE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


class TurnFormatError(ValueError):
    """A turn value is not in the form :func:`hermes_core.trajectory.to_sharegpt` writes."""


@dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block: the tool's name and its arguments (a JSON value, or the raw string)."""

    name: str
    arguments: Any


@dataclass(frozen=True)
class GptTurn:
    """A parsed ``gpt`` value.

    Attributes:
        reasoning: the text of the leading ``<think>`` block, None when it is empty.
        content: the text between the think block and the tool calls (may be ``""``).
        calls: the tool calls, in order.
    """

    reasoning: str | None
    content: str
    calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ToolResponse:
    """One ``<tool_response>`` block: ``content`` is the tool's result (a JSON value or a string)."""

    tool_call_id: str | None
    name: str | None
    content: Any


def _load(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise TurnFormatError(f"{what} is not JSON: {exc}") from None


def parse_system_tools(value: str) -> list[dict[str, Any]]:
    """The tools listed in a system turn, as ``[{"name", "description", "parameters"}]``.

    Accepts the reference's flattened entries (``{"name", "description", "parameters",
    "required"}``) and the OpenAI wrapper (``{"type": "function", "function": {...}}``) that
    rows written before the flattened form have.

    Raises:
        TurnFormatError: no ``<tools>`` block, or its body is not a JSON array of objects.
    """
    match = _TOOLS_RE.search(value)
    if match is None:
        raise TurnFormatError("system turn has no <tools> block")
    entries = _load(match.group(1), "the <tools> block")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TurnFormatError("the <tools> block is not a JSON array of objects")
    tools = []
    for entry in entries:
        function = entry.get("function") if isinstance(entry.get("function"), dict) else entry
        tools.append(
            {
                "name": function.get("name"),
                "description": function.get("description", ""),
                "parameters": function.get("parameters", {}),
            }
        )
    return tools


def parse_gpt_turn(value: str) -> GptTurn:
    """Split a ``gpt`` value into reasoning, content and tool calls.

    Raises:
        TurnFormatError: the value does not start with a ``<think>`` block, or a tool call
            is not a JSON object with a string ``name``.
    """
    think = _THINK_RE.match(value)
    if think is None:
        raise TurnFormatError("gpt turn does not start with a <think> block")
    reasoning = (think.group(1) or "").strip() or None
    rest = value[think.end() :]
    calls: list[ToolCall] = []
    tail = _CALLS_RE.search(rest)
    if tail is not None:
        for body in _CALL_RE.findall(tail.group(1)):
            payload = _load(body, "a <tool_call> block")
            if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
                raise TurnFormatError('a <tool_call> block is not {"name": ..., "arguments": ...}')
            calls.append(ToolCall(payload["name"], payload.get("arguments")))
        rest = rest[: tail.start()]
    return GptTurn(reasoning=reasoning, content=rest.strip(), calls=calls)


def parse_tool_turn(value: str) -> list[ToolResponse]:
    """The ``<tool_response>`` blocks of a ``tool`` value, in order.

    Raises:
        TurnFormatError: no block, or a block is not a JSON object.
    """
    responses = []
    for body in _RESPONSE_RE.findall(value):
        payload = _load(body, "a <tool_response> block")
        if not isinstance(payload, dict):
            raise TurnFormatError("a <tool_response> block is not a JSON object")
        responses.append(
            ToolResponse(payload.get("tool_call_id"), payload.get("name"), payload.get("content"))
        )
    if not responses:
        raise TurnFormatError("tool turn has no <tool_response> block")
    return responses


def _json_text(value: Any) -> str:
    """A string as is, any other JSON value serialised (``ensure_ascii=False``, default separators)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _message(role: str, content: str, **extra: Any) -> dict[str, Any]:
    """One chat message with every key present (one schema for all messages)."""
    return {
        "role": role,
        "content": content,
        "reasoning": extra.get("reasoning"),
        "tool_calls": extra.get("tool_calls"),
        "tool_call_id": extra.get("tool_call_id"),
        "name": extra.get("name"),
    }


def to_chat_messages(conversations: Sequence[Mapping[str, Any]]) -> tuple[list[dict], list[dict]]:
    """A row's ShareGPT turns as OpenAI chat messages and the tools offered.

    Messages (every one has the keys ``role, content, reasoning, tool_calls, tool_call_id,
    name``; unused ones are None):

    * ``system``: content = the system turn (the tools prompt);
    * ``user``: content = the human turn;
    * ``assistant``: content, ``reasoning`` (the think block, None when empty) and
      ``tool_calls`` = ``[{"id", "type": "function", "function": {"name", "arguments"}}]``
      with ``arguments`` a JSON string; None when the turn calls no tool;
    * ``tool``: one per ``<tool_response>`` block, ``tool_call_id``, ``name``, content as a
      string (JSON-serialised when the result is JSON).

    A call's id is the ``tool_call_id`` of the response at the same position in the next
    tool turn; a call without one gets ``call_<turn>_<n>``.

    Returns:
        ``(messages, tools)``; tools = ``[{"type": "function", "function": {"name",
        "description", "parameters"}}]`` from the system turn (``[]`` without one).

    Raises:
        TurnFormatError: a turn is not in the converter's form, or has an unknown ``from``.
    """
    messages: list[dict] = []
    tools: list[dict] = []
    responses_of: dict[int, list[ToolResponse]] = {}
    turns = list(conversations)
    for number, turn in enumerate(turns):
        if turn.get("from") == "tool":
            responses_of[number] = parse_tool_turn(turn.get("value") or "")
    for number, turn in enumerate(turns):
        kind, value = turn.get("from"), turn.get("value") or ""
        if kind == "system":
            tools = [{"type": "function", "function": t} for t in parse_system_tools(value)]
            messages.append(_message("system", value))
        elif kind == "human":
            messages.append(_message("user", value))
        elif kind == "gpt":
            parsed = parse_gpt_turn(value)
            following = responses_of.get(number + 1, [])
            calls = []
            for n, call in enumerate(parsed.calls):
                given = following[n].tool_call_id if n < len(following) else None
                calls.append(
                    {
                        "id": given if isinstance(given, str) and given else f"call_{number}_{n}",
                        "type": "function",
                        "function": {"name": call.name, "arguments": _json_text(call.arguments)},
                    }
                )
            messages.append(
                _message("assistant", parsed.content, reasoning=parsed.reasoning, tool_calls=calls or None)
            )
        elif kind == "tool":
            for n, response in enumerate(responses_of[number]):
                call_id = response.tool_call_id
                if not isinstance(call_id, str) or not call_id:
                    call_id = f"call_{number - 1}_{n}"
                messages.append(
                    _message("tool", _json_text(response.content), tool_call_id=call_id, name=response.name)
                )
        else:
            raise TurnFormatError(f"unknown turn kind {kind!r} (expected system, human, gpt or tool)")
    return messages, tools
