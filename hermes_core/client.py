"""The model client: OpenAI Chat Completions with tools, routing and reasoning options.

Retries are the openai SDK's own (``max_retries``): 408/409/429/5xx, timeouts
and connection errors, exponential backoff with jitter (0.5 s doubling to 8 s),
honouring ``Retry-After`` / ``retry-after-ms`` up to 120 s (openai-python
``_base_client.py``). What is left after them is turned into a
:class:`~hermes_core.exceptions.ModelError` carrying the provider's message.
OpenRouter options (``provider``, ``reasoning``) travel in ``extra_body``
(https://openrouter.ai/docs/api-reference/parameters).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
from pydantic import BaseModel, Field, SecretStr

from hermes_core.exceptions import ConfigError, ModelError
from hermes_core.trajectory import extract_reasoning

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
ProviderSort = Literal["price", "throughput", "latency"]


class ModelOptions(BaseModel):
    """What is sent with every request besides messages and tools."""

    model: str = Field(description="Model id, e.g. anthropic/claude-sonnet-4.6 or mock/scripted.")
    max_tokens: int | None = Field(
        default=None, ge=1, description="Per-response token limit; None = model default."
    )
    providers_allowed: list[str] | None = Field(default=None, description="OpenRouter provider.only.")
    providers_ignored: list[str] | None = Field(default=None, description="OpenRouter provider.ignore.")
    providers_order: list[str] | None = Field(default=None, description="OpenRouter provider.order.")
    provider_sort: ProviderSort | None = Field(default=None, description="OpenRouter provider.sort.")
    reasoning_effort: ReasoningEffort | None = Field(
        default=None, description="reasoning.effort when enabled."
    )
    reasoning_disabled: bool = Field(
        default=False, description="Send reasoning {effort: none}; wins over effort."
    )

    def extra_body(self) -> dict[str, Any]:
        """The OpenRouter fields of the request body (``provider``, ``reasoning``); empty when unset."""
        body: dict[str, Any] = {}
        provider = {
            key: value
            for key, value in (
                ("only", self.providers_allowed),
                ("ignore", self.providers_ignored),
                ("order", self.providers_order),
                ("sort", self.provider_sort),
            )
            if value
        }
        if provider:
            body["provider"] = provider
        if self.reasoning_disabled:
            body["reasoning"] = {"effort": "none"}
        elif self.reasoning_effort:
            body["reasoning"] = {"enabled": True, "effort": self.reasoning_effort}
        return body


@dataclass
class Usage:
    """Token usage (tokens) and cost (USD, only when the provider reports it) of one or more calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None

    def add(self, other: Usage) -> None:
        """Accumulate ``other`` into this usage."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.reasoning_tokens += other.reasoning_tokens
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost

    def as_dict(self) -> dict[str, Any]:
        """``{prompt_tokens, completion_tokens, reasoning_tokens, cost}`` for the row's metadata."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cost": None if self.cost is None else round(self.cost, 8),
        }

    @classmethod
    def from_api(cls, usage: Any) -> Usage:
        """Read a response's ``usage`` (JSON dict or SDK ``CompletionUsage``; ``cost`` and reasoning tokens when present)."""
        if usage is None:
            return cls()
        data = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
        details = data.get("completion_tokens_details")
        details = details if isinstance(details, dict) else {}
        cost = data.get("cost")
        return cls(
            prompt_tokens=int(data.get("prompt_tokens") or 0),
            completion_tokens=int(data.get("completion_tokens") or 0),
            reasoning_tokens=int(details.get("reasoning_tokens") or 0),
            cost=float(cost) if isinstance(cost, int | float) else None,
        )


@dataclass
class ModelTurn:
    """One assistant response.

    Attributes:
        message: ``{"role": "assistant", "content", "reasoning", "tool_calls"?, "finish_reason"}``
            with native reasoning already extracted and tool call arguments as raw JSON text.
        usage: usage of this call.
    """

    message: dict[str, Any]
    usage: Usage = field(default_factory=Usage)


_NON_RETRYABLE = (
    openai.BadRequestError,
    openai.AuthenticationError,
    openai.PermissionDeniedError,
    openai.NotFoundError,
    openai.UnprocessableEntityError,
)

_clients: dict[tuple[str, str, float, int], openai.OpenAI] = {}
_clients_lock = threading.Lock()


class ModelClient:
    """Chat Completions client for one run; safe to share between threads.

    Args:
        options: model id and request options.
        base_url: OpenAI-compatible endpoint (…/v1).
        api_key: the key; may be None only for local endpoints that need none.
        timeout: seconds per request.
        max_retries: SDK retries on transient errors.
    """

    def __init__(
        self,
        options: ModelOptions,
        *,
        base_url: str,
        api_key: SecretStr | None,
        timeout: float = 600.0,
        max_retries: int = 5,
    ):
        self.options = options
        self.base_url = base_url
        key = api_key.get_secret_value() if api_key else ""
        if not key:
            if "://127.0.0.1" in base_url or "://localhost" in base_url:
                key = "local-no-key"
            else:
                raise ConfigError(
                    f"no API key for {base_url}: set OPENROUTER_API_KEY or OPENAI_API_KEY (or pass --api_key)"
                )
        cache_key = (base_url, key, timeout, max_retries)
        with _clients_lock:
            if cache_key not in _clients:
                _clients[cache_key] = openai.OpenAI(
                    base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries
                )
            self._client = _clients[cache_key]
        self._extra_body = options.extra_body()

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, timeout: float | None = None
    ) -> ModelTurn:
        """Send one Chat Completions request and return the assistant turn.

        Args:
            messages: OpenAI-format messages to send.
            tools: OpenAI ``tools`` entries (may be empty).
            timeout: this request's timeout in seconds (e.g. bounded by the prompt deadline).

        Raises:
            ModelError: non-retryable 4xx (provider's message), or a transient error
                left after the SDK's retries (``retryable=True``), or an empty response.
        """
        body: dict[str, Any] = {"model": self.options.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if self.options.max_tokens:
            body["max_tokens"] = self.options.max_tokens
        body.update(self._extra_body)
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        try:
            # The SDK's transport (retries, Retry-After, error types) without its per-call
            # recursive transform of messages and tools, and without building response models
            # (cast_to=object returns the decoded JSON): 3 ms less CPU per call (bench/ANALYSIS.md).
            response = self._client.post("/chat/completions", body=body, options=options, cast_to=object)
        except _NON_RETRYABLE as exc:
            raise ModelError(_describe(exc), status_code=exc.status_code, retryable=False) from None
        except openai.APIStatusError as exc:
            raise ModelError(_describe(exc), status_code=exc.status_code, retryable=True) from None
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise ModelError(f"{type(exc).__name__}: {exc}", retryable=True) from None
        except ValueError as exc:  # a JSON reply that does not decode (e.g. cut off)
            raise ModelError(f"the provider's reply is not valid JSON: {exc}", retryable=True) from None
        return _read_turn(response)


def _read_turn(response: Any) -> ModelTurn:
    """The assistant turn of a decoded Chat Completions response (``{"choices": [...], "usage"}``).

    Tool call arguments that arrive as JSON values instead of text are turned into JSON text.

    Raises:
        ModelError: (retryable) when the response has no choice or is not shaped like a Chat
            Completions object.
    """
    choices = response.get("choices") if isinstance(response, dict) else None
    if not choices:
        error = response.get("error") if isinstance(response, dict) else None
        detail = f": {error.get('message') if isinstance(error, dict) else error}" if error else ""
        raise ModelError(f"the provider returned no choices{detail}", retryable=True)
    try:
        choice = choices[0]
        raw = choice["message"]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": raw.get("content"),
            "reasoning": extract_reasoning(raw),
            "finish_reason": choice.get("finish_reason"),
        }
        if raw.get("tool_calls"):
            message["tool_calls"] = [_read_tool_call(call) for call in raw["tool_calls"]]
        usage = Usage.from_api(response.get("usage"))
    except (LookupError, AttributeError, TypeError, ValueError) as exc:
        raise ModelError(
            f"the provider returned a malformed response ({type(exc).__name__}: {exc}): {str(response)[:300]}",
            retryable=True,
        ) from None
    return ModelTurn(message=message, usage=usage)


def _read_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """One ``tool_calls`` entry as ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
    function = call["function"]
    arguments = function.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": function.get("name"), "arguments": arguments},
    }


def _describe(exc: openai.APIStatusError) -> str:
    """``HTTP <status>: <provider message>`` from an SDK status error."""
    body = exc.body
    message = None
    if isinstance(body, dict):
        err = body.get("error", body)
        message = err.get("message") if isinstance(err, dict) else str(err)
    return f"HTTP {exc.status_code}: {message or exc.message}"
