"""The offline ``mock/`` model: a TEST DOUBLE, not a language model.

It is a real OpenAI-compatible HTTP server (``POST /v1/chat/completions``) that
answers deterministically like a tool-using model: reasoning, calls of the
offered tools with sensible arguments, then a final answer. Options in the
model id (``mock/scripted?rate_limit=2&latency_ms=200``) or ``[mock:...]``
directives in the first user message inject the faults real providers show:
429 with Retry-After, 5xx, hangs (client timeouts), invalid JSON arguments,
unknown tool names, missing reasoning, endless tool loops, length cuts and
latency. Use it for tests and demos only; the agent talks to it through the
same HTTP client code as to a real provider (README § The offline mock/ model).

Examples:
    >>> import openai
    >>> with MockServer() as server:
    ...     client = openai.OpenAI(base_url=server.base_url, api_key="x")
    ...     reply = client.chat.completions.create(
    ...         model="mock/scripted", messages=[{"role": "user", "content": "Say hi"}]
    ...     )
    >>> reply.choices[0].finish_reason
    'stop'
"""

from __future__ import annotations

from typing import Any

from hermes_core.mockllm._options import MockOptions, is_mock_model, parse_model_options

_SERVER_NAMES = ("MockServer", "create_app", "ensure_mock_server")


def __getattr__(name: str) -> Any:
    """The server names, imported on first use: FastAPI and uvicorn load only when a mock server is needed."""
    if name not in _SERVER_NAMES:
        raise AttributeError(f"module 'hermes_core.mockllm' has no attribute {name!r}")
    from hermes_core.mockllm import _server

    value = getattr(_server, name)
    globals()[name] = value
    return value


__all__ = [
    "MockOptions",
    "MockServer",
    "create_app",
    "ensure_mock_server",
    "is_mock_model",
    "parse_model_options",
]
