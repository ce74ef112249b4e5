"""The Hermes agent loop: call the model, run the tool calls it asks for, repeat.

``Agent.run`` loops over ``Agent.step`` until a turn has no tool calls. Typed
endings (:mod:`hermes_core.exceptions`) stop it: the turn limit
(``completed=False``), an output cut by length or three consecutive malformed
tool calls (``partial=True``). Any other error propagates and fails the prompt.
Pattern after mini-swe-agent ``agents/default.py``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from hermes_core.cancel import check_cancelled
from hermes_core.client import ModelClient, Usage
from hermes_core.exceptions import (
    AgentStop,
    OutputTruncated,
    PromptTimeout,
    RepeatedToolErrors,
    TurnLimitReached,
)
from hermes_core.options import DEFINING, INTERNAL
from hermes_core.tools import Tool, ToolContext
from hermes_core.trajectory import reasoning_counts

log = logging.getLogger("hermes_core.agent")


class AgentConfig(BaseModel):
    """Configuration of one agent run (one declaration per option)."""

    max_turns: int = Field(
        default=10, ge=1, description="Most model calls per prompt.", json_schema_extra=DEFINING
    )
    ephemeral_system_prompt: str | None = Field(
        default=None,
        description="System prompt sent with every call, never stored in the trajectory.",
        json_schema_extra=DEFINING,
    )
    prefill_messages: list[dict[str, str]] = Field(
        default_factory=list,
        description="Few-shot {role, content} messages sent after the system prompt, never stored.",
        json_schema_extra={**DEFINING, **INTERNAL},
    )
    max_consecutive_tool_errors: int = Field(
        default=3,
        ge=1,
        description="Unknown-tool / invalid-JSON calls in a row that end the run as partial.",
        json_schema_extra=INTERNAL,
    )
    log_prefix_chars: int = Field(
        default=100, ge=0, description="Preview length of tool calls and results in logs."
    )


@dataclass
class AgentResult:
    """What one agent run produced.

    Attributes:
        messages: the stored conversation (user, assistant, tool messages; no
            ephemeral system prompt, no prefill).
        tools: OpenAI ``tools`` entries offered to the model.
        api_calls: model calls made.
        completed: False when the turn limit ended the run.
        partial: True when the run stopped early (length cut, repeated tool errors).
        stop_reason: ``final_answer``, or the class name of the ending.
        usage: summed token usage and cost.
        duration_s: wall time of the run, seconds.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    api_calls: int
    completed: bool
    partial: bool
    stop_reason: str
    usage: Usage
    duration_s: float

    @property
    def reasoning(self) -> tuple[int, int]:
        """(assistant turns, turns with reasoning)."""
        return reasoning_counts(self.messages)

    @property
    def final_response(self) -> str | None:
        """The text of the last assistant turn when it calls no tool (the final answer), else None."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                if message.get("tool_calls"):
                    return None
                content = message.get("content")
                return content if isinstance(content, str) else None
        return None


@dataclass
class Agent:
    """One prompt's agent: model client, offered tools, tool context and config."""

    client: ModelClient
    tools: list[Tool]
    ctx: ToolContext
    config: AgentConfig = field(default_factory=AgentConfig)
    messages: list[dict[str, Any]] = field(default_factory=list)
    api_calls: int = 0
    _bad_calls_in_a_row: int = 0

    @property
    def usage(self) -> Usage:
        """The prompt's usage so far: this loop's model calls and those its tools made (``ctx.usage``)."""
        return self.ctx.usage

    def run(self, prompt: str) -> AgentResult:
        """Run the loop on ``prompt`` from a fresh conversation.

        Raises:
            ModelError, PromptTimeout, SandboxError: the prompt failed. What it spent until then
                is :attr:`usage` (``ctx.usage``): :func:`hermes_core.runner.run_prompt` puts it on
                the error it raises.
        """
        started = time.monotonic()
        self.messages = [{"role": "user", "content": prompt}]
        self._by_name = {t.name: t for t in self.tools}
        self._schemas = [t.schema(self.ctx.settings) for t in self.tools]
        completed, partial, reason = True, False, "final_answer"
        try:
            while not self.step():
                pass
        except AgentStop as stop:
            completed, partial, reason = stop.completed, stop.partial, type(stop).__name__
        return AgentResult(
            messages=self.messages,
            tools=self._schemas,
            api_calls=self.api_calls,
            completed=completed,
            partial=partial,
            stop_reason=reason,
            usage=self.usage,
            duration_s=time.monotonic() - started,
        )

    def step(self) -> bool:
        """One turn: a model call, then its tool calls in order. Returns True after a final answer."""
        if self.api_calls >= self.config.max_turns:
            raise TurnLimitReached(f"{self.api_calls} model calls made")
        self._time_left()
        turn = self.client.complete(self._request_messages(), self._schemas, deadline=self.ctx.deadline)
        self.api_calls += 1
        self.ctx.add_usage(turn.usage)
        self.messages.append(turn.message)
        if turn.message["finish_reason"] == "length":
            raise OutputTruncated("the response was cut by the length limit")
        calls = turn.message.get("tool_calls") or []
        for i, call in enumerate(calls):
            try:
                self.messages.append(self._execute(call))
            except RepeatedToolErrors:
                for skipped in calls[i + 1 :]:  # a tool call never goes without a result
                    note = {"error": "Not run: the turn ended after repeated malformed tool calls"}
                    self.messages.append(_tool_message(skipped, json.dumps(note)))
                raise
        return not calls

    def _request_messages(self) -> list[dict[str, Any]]:
        head = [{"role": "system", "content": self.config.ephemeral_system_prompt}] * bool(
            self.config.ephemeral_system_prompt
        )
        sent = [_wire(m) for m in self.messages]
        return [*head, *self.config.prefill_messages, *sent]

    def _time_left(self) -> float | None:
        check_cancelled()
        if self.ctx.deadline is None:
            return None
        left = self.ctx.deadline - time.monotonic()
        if left <= 0:
            raise PromptTimeout(f"prompt deadline passed after {self.api_calls} model calls")
        return left

    def _execute(self, call: dict[str, Any]) -> dict[str, Any]:
        name = call["function"]["name"]
        raw_args = call["function"]["arguments"]
        tool = self._by_name.get(name)
        try:
            arguments = json.loads(raw_args) if raw_args.strip() else {}
        except json.JSONDecodeError as exc:
            arguments = exc
        if tool is None:
            content = json.dumps({"error": f"Unknown tool: {name}"})
        elif not isinstance(arguments, dict):
            content = json.dumps({"error": f"Invalid JSON arguments for {name}: {arguments}"})
        else:
            self._bad_calls_in_a_row = 0
            preview = self.config.log_prefix_chars
            log.debug("tool call %s(%s)", name, raw_args[:preview])
            content = tool.invoke(self.ctx, arguments)
            log.debug("tool result %s: %s", name, content[:preview])
            return _tool_message(call, content)
        self._bad_calls_in_a_row += 1
        if self._bad_calls_in_a_row >= self.config.max_consecutive_tool_errors:
            self.messages.append(_tool_message(call, content))
            raise RepeatedToolErrors(f"{self._bad_calls_in_a_row} malformed tool calls in a row")
        return _tool_message(call, content)


def _tool_message(call: dict[str, Any], content: str) -> dict[str, Any]:
    """The tool message answering ``call``."""
    return {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"], "content": content}


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """A stored message as sent to the API (our bookkeeping keys removed)."""
    if message["role"] != "assistant":
        return message
    wire = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        wire["tool_calls"] = message["tool_calls"]
    return wire


__all__ = ["Agent", "AgentConfig", "AgentResult"]
