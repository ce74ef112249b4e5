"""The model client: OpenAI Chat Completions with tools, routing and reasoning options.

The openai SDK is the transport (HTTP, error types); retries are ours so that they see the
prompt's deadline and every rate-limit answer: 408/409/429/5xx, timeouts, connection errors
and malformed replies are retried up to ``max_retries`` times with exponential backoff and
jitter (0.5 s doubling to 8 s, minus up to 25%) or the provider's ``Retry-After`` /
``retry-after-ms`` when it is at most 60 s: the openai SDK's own policy
(openai-python ``_base_client.py``, ``_calculate_retry_timeout``), kept so that users see the
same behaviour. A retry that could not finish before the prompt's deadline is not started:
the prompt fails with :class:`~hermes_core.exceptions.PromptTimeout` instead. What is left
after the retries is a :class:`~hermes_core.exceptions.ModelError` carrying the provider's
message. OpenRouter options (``provider``, ``reasoning``) travel in the request body
(https://openrouter.ai/docs/api-reference/parameters).

Each request runs through :func:`hermes_core.cancel.call_interruptibly`, so a cancelled run
does not wait for a slow model. With a run-wide :class:`~hermes_core.limiter.ConcurrencyLimiter`,
each attempt takes a slot before it is sent and reports its answer after (status, Retry-After,
``x-ratelimit-*`` headers), so the retries wait on the limiter too. On OpenRouter the body asks
for the request's cost (``usage: {"include": true}``).
"""

from __future__ import annotations

import email.utils
import json
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import openai
import tenacity
from pydantic import BaseModel, Field, SecretStr

from hermes_core import cancel
from hermes_core.endpoints import require_key, resolve_base_url
from hermes_core.exceptions import ModelError, PromptTimeout
from hermes_core.limiter import ConcurrencyLimiter
from hermes_core.options import DEFINING, DEFINING_WHEN_SET, CommaList
from hermes_core.redaction import valid_text
from hermes_core.settings import HermesSettings
from hermes_core.spend_guard import RequestGuard
from hermes_core.trajectory import extract_reasoning
from hermes_core.usage import Usage

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]
"""OpenRouter ``reasoning.effort`` values (the reference's, with its newer ``max`` and ``ultra``)."""
ProviderSort = Literal["price", "throughput", "latency"]
DEFAULT_MODEL = "anthropic/claude-sonnet-4.6"
"""The reference batch runner's default model."""


class ModelOptions(BaseModel):
    """What is sent with every request besides messages and tools (one declaration per option)."""

    model: str = Field(
        default=DEFAULT_MODEL,
        description="Model id, e.g. anthropic/claude-sonnet-4.6; mock/... uses the built-in offline model.",
        json_schema_extra=DEFINING,
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Token limit per response (default: the model's).",
        json_schema_extra=DEFINING,
    )
    providers_allowed: CommaList | None = Field(
        default=None, description="OpenRouter provider.only: providers allowed (comma list)."
    )
    providers_ignored: CommaList | None = Field(
        default=None, description="OpenRouter provider.ignore: providers never used (comma list)."
    )
    providers_order: CommaList | None = Field(
        default=None, description="OpenRouter provider.order: providers tried in this order (comma list)."
    )
    provider_sort: ProviderSort | None = Field(
        default=None, description="OpenRouter provider.sort: price, throughput or latency."
    )
    temperature: float | None = Field(
        default=None,
        ge=0,
        le=2,
        description="Sampling temperature (default: the provider's); set it so that samples differ.",
        json_schema_extra=DEFINING_WHEN_SET,
    )
    top_p: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Nucleus sampling: the top_p probability mass (default: the provider's).",
        json_schema_extra=DEFINING_WHEN_SET,
    )
    reasoning_effort: ReasoningEffort | None = Field(
        default=None,
        description="Reasoning effort, sent as reasoning: {enabled: true, effort}.",
        json_schema_extra=DEFINING,
    )
    reasoning_disabled: bool = Field(
        default=False,
        description="Disable reasoning tokens, sent as reasoning: {effort: none}; wins over the effort.",
        json_schema_extra=DEFINING,
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
_RETRYABLE_STATUS = frozenset({408, 409, 429})
INITIAL_RETRY_DELAY = 0.5
"""Seconds before the first retry (doubling each time), as the openai SDK."""
MAX_RETRY_DELAY = 8.0
"""Longest backoff between two attempts, seconds, as the openai SDK."""
MAX_RETRY_AFTER = 60.0
"""Longest ``Retry-After`` honoured as given, seconds; a longer one falls back to the backoff."""

CONNECTION_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=5.0)
"""Connections of one HTTP client of the process: no limit (the requests in flight bound them, at
most :data:`REQUESTS_PER_HTTP_CLIENT` each). The SDK's default (1,000 connections, 100 kept alive)
made requests beyond the 1,000th wait a whole call for a free connection at W = 1,024 and re-opened
a connection for most requests above W = 100 (bench/ANALYSIS.md)."""

REQUESTS_PER_HTTP_CLIENT = 32
"""Most requests in flight on one HTTP client (connection pool) before another client is opened.

httpcore's pool runs a pass over all its connections and waiting requests under one lock at the
start and at the end of every request (``ConnectionPool._assign_requests_to_connections``): with
1,024 requests in flight on one pool, 788 of the 1,024 request threads were found waiting for that
lock and a 10 s model call took 16-22 s at the client (bench/ANALYSIS.md). Pools of at most 32
keep each pass short; a run of 32 prompts or fewer uses one."""


class HttpClients:
    """The process's HTTP clients to one endpoint, opened as concurrency needs them; safe between threads.

    Args:
        make: opens one client (an ``openai.OpenAI``, with its own connection pool).
        per_client: most requests in flight on one client (:data:`REQUESTS_PER_HTTP_CLIENT`).

    :meth:`lease` gives the first client with room, so the connections of a quieter run stay on
    the first clients and the others' idle connections expire.
    """

    def __init__(self, make: Callable[[], openai.OpenAI], per_client: int = REQUESTS_PER_HTTP_CLIENT):
        self._make = make
        self._per_client = per_client
        self._clients: list[list] = []  # [client, requests in flight]
        self._lock = threading.Lock()

    @property
    def opened(self) -> int:
        """How many clients were opened."""
        return len(self._clients)

    @contextmanager
    def lease(self) -> Iterator[openai.OpenAI]:
        """A client for one request, counted as in flight on it until the block ends."""
        with self._lock:
            entry = next((e for e in self._clients if e[1] < self._per_client), None)
            if entry is None:
                entry = [self._make(), 0]
                self._clients.append(entry)
            entry[1] += 1
        try:
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1


_http_clients: dict[tuple[str, str, float], HttpClients] = {}
_http_clients_lock = threading.Lock()


def http_clients(base_url: str, key: str, timeout: float) -> HttpClients:
    """The process's :class:`HttpClients` to ``base_url`` with ``key`` (one set per endpoint, key, timeout)."""
    cache_key = (base_url, key, timeout)
    with _http_clients_lock:
        if cache_key not in _http_clients:
            _http_clients[cache_key] = HttpClients(
                lambda: openai.OpenAI(
                    base_url=base_url,
                    api_key=key,
                    timeout=timeout,
                    max_retries=0,
                    http_client=openai.DefaultHttpxClient(timeout=timeout, limits=CONNECTION_LIMITS),
                )
            )
        return _http_clients[cache_key]


class ModelClient:
    """Chat Completions client for one run; safe to share between threads.

    Args:
        options: model id and request options.
        base_url: OpenAI-compatible endpoint (…/v1).
        api_key: the key; may be None only for local endpoints that need none.
        timeout: seconds per request (each attempt).
        max_retries: retries of one request on transient errors (so ``max_retries + 1`` attempts).
        limiter: the run-wide limit on requests in flight, or None (no limit).
        guard: the run's spend cap, asked before each request and told each answer's usage
            (:mod:`hermes_core.spend_guard`), or None.

    Raises:
        ConfigError: no key for an endpoint that is not on this machine.
    """

    def __init__(
        self,
        options: ModelOptions,
        *,
        base_url: str,
        api_key: SecretStr | None,
        timeout: float = 600.0,
        max_retries: int = 5,
        limiter: ConcurrencyLimiter | None = None,
        guard: RequestGuard | None = None,
    ):
        self.options = options
        self.limiter = limiter
        self.guard = guard
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.http = http_clients(base_url, require_key(base_url, api_key), timeout)
        self._extra_body = options.extra_body()
        if reports_cost(base_url):
            self._extra_body["usage"] = {"include": True}  # OpenRouter: usage.cost in every answer

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> ModelTurn:
        """Send one Chat Completions request (retried on transient errors) and return the assistant turn.

        Args:
            messages: OpenAI-format messages to send.
            tools: OpenAI ``tools`` entries (may be empty).
            timeout: seconds per attempt (default: the client's timeout).
            deadline: ``time.monotonic()`` value the whole call, retries and waits included, must
                end by (the prompt's deadline), or None.

        Raises:
            ModelError: non-retryable 4xx (provider's message), or a transient error left after
                the retries (``retryable=True``).
            PromptTimeout: the deadline passed, or the next retry could not finish before it.
            PromptCancelled: the run was cancelled.
        """
        body: dict[str, Any] = {"model": self.options.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if self.options.max_tokens:
            body["max_tokens"] = self.options.max_tokens
        for name in ("temperature", "top_p"):
            if getattr(self.options, name) is not None:
                body[name] = getattr(self.options, name)
        body.update(self._extra_body)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, ModelError) and exc.retryable),
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=_retry_wait,
            before_sleep=lambda state: _refuse_past(
                deadline, state.upcoming_sleep, state.outcome.exception()
            ),
            sleep=cancel.sleep,
            reraise=True,
        )
        return retrying(self._attempt, body, timeout or self.timeout, deadline)

    def _attempt(self, body: dict[str, Any], timeout: float, deadline: float | None) -> ModelTurn:
        """One HTTP request, in a slot of the run's limiter when there is one (see :meth:`_request`),
        checked against the run's spend cap when there is a guard (it may raise PromptCancelled)."""
        limiter, guard = self.limiter, self.guard
        if guard is not None:
            guard.before_request()
        if limiter is None:
            turn = self._request(body, timeout, deadline, {})
        else:
            ticket = limiter.acquire(deadline)
            seen: dict[str, Any] = {}
            try:
                turn = self._request(body, timeout, deadline, seen)
            finally:
                limiter.release(
                    ticket,
                    status=seen.get("status"),
                    retry_after=seen.get("retry_after"),
                    headers=seen.get("headers"),
                )
        if guard is not None:
            guard.after_request(turn.usage)
        return turn

    def _post(self, body: dict[str, Any], timeout: float) -> httpx.Response:
        with self.http.lease() as client:
            return client.post(
                "/chat/completions", body=body, options={"timeout": timeout}, cast_to=httpx.Response
            )

    def _request(
        self, body: dict[str, Any], timeout: float, deadline: float | None, seen: dict[str, Any]
    ) -> ModelTurn:
        """One HTTP request; every failure becomes a ModelError (``retryable`` when transient).

        ``seen`` gets the answer's ``status``, ``retry_after`` and ``headers`` when there was an answer.
        """
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PromptTimeout("prompt deadline passed before a model request")
            timeout = min(timeout, left)
        try:
            # The SDK's transport and error types without its per-call recursive transform of
            # messages and tools, and without building response models (the raw response, decoded
            # here): 3 ms less CPU per call (bench/ANALYSIS.md).
            response = cancel.call_interruptibly(lambda: self._post(body, timeout))
            seen.update(status=response.status_code, headers=response.headers)
            data = response.json()
        except _NON_RETRYABLE as exc:
            seen.update(status=exc.status_code, headers=exc.response.headers)
            raise ModelError(_describe(exc), status_code=exc.status_code, retryable=False) from None
        except openai.APIStatusError as exc:
            retryable = _should_retry(exc)
            retry_after = _retry_after(exc.response.headers)
            seen.update(status=exc.status_code, headers=exc.response.headers, retry_after=retry_after)
            raise ModelError(
                _describe(exc),
                status_code=exc.status_code,
                retryable=retryable,
                retry_after=retry_after if retryable else None,
            ) from None
        except openai.APITimeoutError as exc:
            if deadline is not None and time.monotonic() >= deadline - 0.05:
                raise PromptTimeout("prompt deadline passed during a model request") from None
            raise ModelError(f"{type(exc).__name__}: {exc}", retryable=True) from None
        except openai.APIConnectionError as exc:
            raise ModelError(f"{type(exc).__name__}: {exc}", retryable=True) from None
        except ValueError as exc:  # a JSON reply that does not decode (e.g. cut off)
            raise ModelError(f"the provider's reply is not valid JSON: {exc}", retryable=True) from None
        return _read_turn(data)


def side_client(
    model: str,
    base_url: str | None,
    settings: HermesSettings,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    limiter: ConcurrencyLimiter | None = None,
    guard: RequestGuard | None = None,
) -> ModelClient:
    """A client for a side request of a run (a judge, a summariser): its own model, endpoint and
    sampling; the settings' key, timeout and retries; the run's limiter and spend guard when given.

    Args:
        model: the model id (``mock/...`` uses the built-in mock server).
        base_url: its endpoint, or None: the mock server for ``mock/`` ids, else ``settings.base_url``
            (:func:`hermes_core.endpoints.resolve_base_url`).
        settings: the API key (``settings.api_key``), ``request_timeout`` (seconds per attempt) and
            ``max_retries``.
        max_tokens / temperature: sent with every request (None: the provider's default).
        limiter / guard: the run's request limiter and spend cap, or None.

    Raises:
        ConfigError: no key for an endpoint that is not on this machine.
    """
    return ModelClient(
        ModelOptions(model=model, max_tokens=max_tokens, temperature=temperature),
        base_url=resolve_base_url(model, base_url, settings),
        api_key=settings.api_key,
        timeout=settings.request_timeout,
        max_retries=settings.max_retries,
        limiter=limiter,
        guard=guard,
    )


def reports_cost(base_url: str) -> bool:
    """True when the endpoint is known to report each request's cost (OpenRouter, when asked)."""
    return "openrouter.ai" in base_url


def _should_retry(exc: openai.APIStatusError) -> bool:
    """Whether a status error is transient: ``x-should-retry`` when the provider says, else 408/409/429/5xx."""
    hint = exc.response.headers.get("x-should-retry")
    if hint in ("true", "false"):
        return hint == "true"
    return exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500


def _retry_after(headers: Any) -> float | None:
    """Seconds the provider asks to wait (``retry-after-ms``, ``retry-after`` as seconds or an HTTP date)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) / scale
        except ValueError:
            pass
    value = headers.get("retry-after")
    parsed = email.utils.parsedate_tz(value) if value else None
    if parsed is None:
        return None
    return email.utils.mktime_tz(parsed) - time.time()


def _retry_wait(state: tenacity.RetryCallState) -> float:
    """Seconds before the next attempt: the error's ``Retry-After`` when 0 < it <= 60 s, else backoff."""
    exc = state.outcome.exception() if state.outcome else None
    asked = getattr(exc, "retry_after", None)
    if asked is not None and 0 < asked <= MAX_RETRY_AFTER:
        return asked
    backoff = min(INITIAL_RETRY_DELAY * 2.0 ** (state.attempt_number - 1), MAX_RETRY_DELAY)
    return backoff * (1 - 0.25 * random.random())


def _refuse_past(deadline: float | None, wait: float | None, error: BaseException | None) -> None:
    """Before a retry's wait: raise PromptTimeout when the wait alone would reach the deadline."""
    if deadline is not None and time.monotonic() + (wait or 0.0) >= deadline:
        raise PromptTimeout(f"prompt deadline would pass before the next retry (last error: {error})")


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
            "content": _valid(raw.get("content")),
            "reasoning": _valid(extract_reasoning(raw)),
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
    """One ``tool_calls`` entry as ``{"id", "type": "function", "function": {"name", "arguments"}}``.

    A missing id (some OpenAI-compatible servers omit it) is synthesised, so the tool message and
    the trajectory never carry ``null``.
    """
    function = call["function"]
    arguments = function.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": call.get("id") or f"call_{secrets.token_hex(8)}",  # some servers omit it: never null
        "type": "function",
        "function": {"name": _valid(function.get("name")), "arguments": _valid(arguments)},
    }


def _valid(text: Any) -> Any:
    """A text of the model's reply as valid UTF-8 (a lone surrogate decoded from JSON becomes U+FFFD).

    Unfixed, it would make the next request's body unencodable and every file write of the row fail.
    """
    return valid_text(text) if isinstance(text, str) else text


def _describe(exc: openai.APIStatusError) -> str:
    """``HTTP <status>: <provider message>`` from an SDK status error."""
    body = exc.body
    message = None
    if isinstance(body, dict):
        err = body.get("error", body)
        message = err.get("message") if isinstance(err, dict) else str(err)
    return f"HTTP {exc.status_code}: {message or exc.message}"


__all__ = [
    "CONNECTION_LIMITS",
    "DEFAULT_MODEL",
    "INITIAL_RETRY_DELAY",
    "MAX_RETRY_AFTER",
    "MAX_RETRY_DELAY",
    "REQUESTS_PER_HTTP_CLIENT",
    "HttpClients",
    "ModelClient",
    "ModelOptions",
    "ModelTurn",
    "ProviderSort",
    "ReasoningEffort",
    "http_clients",
    "reports_cost",
    "side_client",
]
