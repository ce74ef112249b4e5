"""Tools are declared once: a decorated handler whose signature and docstring are the schema.

A handler is ``fn(ctx: ToolContext, <model-facing args>) -> dict``. The
``@tool`` decorator derives the OpenAI function schema from the type hints
(``Annotated[int, Field(ge=1)]`` for bounds, ``Literal`` for enums) and the
Google-style ``Args:`` section, validates the model's arguments with the same
pydantic model, and registers the tool in :data:`REGISTRY`, the only list of
tools (``tool_stats`` keys come from it). Pattern after openai-agents
``function_schema`` and inspect_ai ``@tool``.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, create_model

from hermes_core.client import Usage
from hermes_core.environments import Environment
from hermes_core.exceptions import PromptTimeout, ToolError
from hermes_core.limiter import ConcurrencyLimiter
from hermes_core.redaction import redact
from hermes_core.settings import HermesSettings
from hermes_core.spend_guard import RequestGuard

Availability = Callable[[HermesSettings], str | None]
"""Returns None when the tool can be offered, else the reason it cannot."""


@dataclass(frozen=True)
class ModelEndpoint:
    """The run's model: what auxiliary tools (vision, moa) use unless settings name their own.

    Attributes:
        base_url: OpenAI-compatible endpoint of the run (the built-in mock server for ``mock/`` models).
        api_key: the run's key (None for local endpoints that need none).
        model: the run's model id.
        limiter: the run's limit on requests in flight to ``base_url`` (None: no limit); an
            auxiliary call to this endpoint takes a slot of it like the agent's own calls.
        guard: the run's spend cap (:mod:`hermes_core.spend_guard`), asked before every
            auxiliary call to this endpoint like before the agent's own; None: unchecked.
    """

    base_url: str
    api_key: SecretStr | None
    model: str
    limiter: ConcurrencyLimiter | None = None
    guard: RequestGuard | None = None


@dataclass
class ToolContext:
    """What a tool handler may use while one prompt runs.

    Attributes:
        env: the prompt's environment; every command and file access goes through it.
        settings: process settings (timeouts, output bounds).
        deadline: ``time.monotonic()`` value after which the prompt is out of time, or None.
        state: per-prompt state owned by tools (e.g. background processes), keyed by tool name.
        cleanups: callables run by :meth:`close` before the environment is torn down.
        model_endpoint: the run's model endpoint, key and id (None outside a run).
        usage: the prompt's token usage and cost so far: the agent's model calls and the model
            calls tools make themselves (vision, moa, browser), added with :meth:`add_usage`;
            the prompt's row, its ledger line and the run's spend cap count all of it.
    """

    env: Environment
    settings: HermesSettings
    deadline: float | None = None
    model_endpoint: ModelEndpoint | None = None
    state: dict[str, Any] = field(default_factory=dict)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    _usage_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_usage(self, usage: Usage) -> None:
        """Count one model call's usage towards the prompt (thread-safe: moa asks its models in parallel)."""
        with self._usage_lock:
            self.usage.add(usage)

    def bound_timeout(self, seconds: float) -> float:
        """Clamp a tool timeout (seconds) to the time left before the prompt's deadline.

        Raises:
            PromptTimeout: the deadline has already passed.
        """
        if self.deadline is None:
            return seconds
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise PromptTimeout("prompt deadline passed during tool execution")
        return max(1.0, min(seconds, left))

    def close(self) -> None:
        """Run the registered cleanups (last registered first); errors in one do not stop the others."""
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except Exception:  # noqa: BLE001 - teardown must go on
                pass


def always_available(settings: HermesSettings) -> str | None:
    """Availability check of tools that need no backend configuration."""
    return None


@dataclass(frozen=True)
class Tool:
    """One tool: name, toolset, description, JSON schema, handler and availability check."""

    name: str
    toolset: str
    description: str
    parameters: dict[str, Any]
    handler: Callable[..., dict[str, Any]]
    arguments_model: type[BaseModel]
    check: Availability = always_available

    def schema(self, settings: HermesSettings | None = None) -> dict[str, Any]:
        """The OpenAI ``tools`` entry: ``{"type": "function", "function": {name, description, parameters}}``.

        ``{setting}`` placeholders in the descriptions (e.g. ``{terminal_timeout}``) are filled from
        ``settings`` (default: the environment's), so the model is told the limits in force.
        """
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        if self._templated:
            function = _render(function, settings or HermesSettings())
        return {"type": "function", "function": function}

    @functools.cached_property
    def _templated(self) -> bool:
        """True when a description holds ``{setting}`` placeholders (checked once)."""
        return bool(_PLACEHOLDER.search(json.dumps([self.description, self.parameters])))

    def unavailable_reason(self, settings: HermesSettings) -> str | None:
        """None when the tool may be offered under ``settings``, else why not."""
        return self.check(settings)

    def invoke(self, ctx: ToolContext, arguments: dict[str, Any]) -> str:
        """Validate ``arguments``, run the handler, return the JSON result string (bounded, redacted).

        A :class:`ToolError` (or invalid arguments) becomes ``{"error": ...}``;
        any other exception propagates and fails the prompt. Every secret value the
        process knows is replaced by ``[REDACTED]`` (:mod:`hermes_core.redaction`) before
        the result goes back to the model: this is the one place every tool result passes.
        """
        try:
            try:
                args = self.arguments_model.model_validate(arguments)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
                )
                raise ToolError(f"Invalid arguments for {self.name}: {problems}") from None
            values = dict(args)
            _refuse_nul_bytes(self.name, values)
            result = self.handler(ctx, **values)
        except ToolError as exc:
            result = {"error": str(exc)[:2048]}
        text = redact(json.dumps(result, ensure_ascii=False))
        limit = ctx.settings.tool_result_max_chars
        if len(text) > limit:
            text = json.dumps(
                {
                    "error": f"Tool result too large ({len(text)} characters, limit {limit}); narrow the request."
                }
            )
        return text


def _refuse_nul_bytes(tool_name: str, values: dict[str, Any]) -> None:
    """Raise ToolError when a string argument (or a string in a list argument) holds a NUL byte.

    No path, command, pattern or URL can hold one (the OS refuses them with ValueError), so this
    is a mistake of the model, answered as one, before any tool runs.
    """
    for name, value in values.items():
        items = value if isinstance(value, list) else [value]
        if any(isinstance(item, str) and "\0" in item for item in items):
            raise ToolError(f"Invalid arguments for {tool_name}: {name} contains a NUL byte")


REGISTRY: dict[str, Tool] = {}

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def _render(node: Any, settings: HermesSettings) -> Any:
    """``node`` with ``{name}`` in its strings replaced by ``settings.name`` (other braces kept)."""
    if isinstance(node, str):
        return _PLACEHOLDER.sub(lambda m: str(getattr(settings, m.group(1), m.group(0))), node)
    if isinstance(node, dict):
        return {key: _render(value, settings) for key, value in node.items()}
    if isinstance(node, list):
        return [_render(value, settings) for value in node]
    return node


_ARGS_RE = re.compile(r"^\s{4}(\w+)\s*(?:\([^)]*\))?:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {arg: description})."""
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\nArgs:\n")
    args: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        if line and not line.startswith(" "):
            break  # next section (Returns:, Raises: ...)
        match = _ARGS_RE.match(line)
        if match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current and line.strip():
            args[current] += " " + line.strip()
    return " ".join(head.split()), args


def _clean_schema(node: Any) -> Any:
    """Make pydantic's JSON schema look like a hand-written tool schema."""
    if isinstance(node, dict):
        node = {k: _clean_schema(v) for k, v in node.items() if k != "title"}
        any_of = node.pop("anyOf", None)
        if any_of is not None:
            kept = [s for s in any_of if s.get("type") != "null"]
            if len(kept) == 1:
                node = {**kept[0], **node}
            else:
                node["anyOf"] = kept
        if node.get("default", 0) is None:
            node.pop("default")
        return node
    if isinstance(node, list):
        return [_clean_schema(v) for v in node]
    return node


def tool(toolset: str, *, name: str | None = None, check: Availability = always_available):
    """Register the decorated handler as a tool of ``toolset``.

    Args:
        toolset: toolset name (``terminal``, ``file``, ``web`` ...).
        name: tool name the model sees; defaults to the function name.
        check: availability check; the tool is offered only when it returns None.

    Raises:
        ValueError: a tool of that name is already registered.
    """

    def decorate(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        tool_name = name or fn.__name__
        if tool_name in REGISTRY:
            raise ValueError(f"tool {tool_name!r} registered twice")
        description, arg_docs = _parse_docstring(fn.__doc__ or "")
        hints = get_type_hints(fn, include_extras=True)
        fields: dict[str, Any] = {}
        for param in list(inspect.signature(fn).parameters.values())[1:]:  # skip ctx
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (hints[param.name], Field(default, description=arg_docs.get(param.name)))
        model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="ignore"), **fields)
        schema = _clean_schema(model.model_json_schema())
        schema.setdefault("properties", {})
        schema.setdefault("required", [])
        REGISTRY[tool_name] = Tool(
            name=tool_name,
            toolset=toolset,
            description=description,
            parameters=schema,
            handler=fn,
            arguments_model=model,
            check=check,
        )
        return fn

    return decorate
