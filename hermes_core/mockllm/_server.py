"""The mock model's HTTP server (FastAPI + uvicorn): endpoints, fault injection, stats, request log.

Faults of one request are decided in this order (``n`` = 0-based index of the
request within its conversation; counters only grow until ``POST /stats/reset``):

0. concurrency limit: with ``max_in_flight=K``, a request that arrives while more than K are being
   served (itself included) answers 429 with ``Retry-After`` at once, as a provider's limit does;
1. latency: ``latency_ms`` (or ``slow_latency_ms`` for the ``slow_rate`` conversations);
2. hang: with ``hang_s``, requests ``n < hang_count`` sleep ``hang_s`` first, then answer normally;
3. always-failing conversations (``fail_rate`` / ``fail_file``): ``error_status``;
4. the next ``rate_limit`` requests: 429 with ``Retry-After``;
5. the next ``error_5xx`` requests: ``error_status``.

So with a single fault option, "the first N requests" are exactly the first N.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from hermes_core.exceptions import ConfigError
from hermes_core.mockllm._model import (
    assistant_turns,
    completion,
    conversation_key,
    first_user_content,
    message_text,
    unit_hash,
)
from hermes_core.mockllm._options import (
    MockOptions,
    build_options,
    is_mock_model,
    model_id_options,
    prompt_directives,
)

MOCK_MODELS = ("mock/scripted",)
"""Model ids listed by ``GET /v1/models`` (any ``mock/...`` id is accepted)."""


_LOG_LOCK = threading.Lock()
"""Serialises request-log appends of every server of this process (several may share one file)."""


class _State:
    """Per-app counters, stats and the optional request log; safe across threads."""

    def __init__(self, request_log: str | None, log_bodies: bool = False) -> None:
        self.request_log = request_log
        self.log_bodies = log_bodies
        self._lock = threading.Lock()
        self._by_conversation: dict[str, int] = {}
        self._finals: dict[str, int] = {}
        self._by_status: Counter[str] = Counter()
        self._requests = 0
        self._in_flight = 0
        self._peak_in_flight = 0

    def opened(self) -> None:
        """A chat-completions request is being served (counts towards ``in_flight``)."""
        with self._lock:
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)

    def closed(self) -> None:
        """A chat-completions request has been answered."""
        with self._lock:
            self._in_flight -= 1

    @property
    def in_flight(self) -> int:
        """Chat-completions requests being served now (this one included)."""
        return self._in_flight

    def arrive(self, key: str | None) -> int:
        """Count a request (of conversation ``key``, if known); return its 0-based index in that conversation."""
        with self._lock:
            self._requests += 1
            if key is None:
                return 0
            n = self._by_conversation.get(key, 0)
            self._by_conversation[key] = n + 1
            return n

    def next_final(self, key: str) -> int:
        """Count a final answer of conversation ``key``; return its 0-based number among them."""
        with self._lock:
            n = self._finals.get(key, 0)
            self._finals[key] = n + 1
            return n

    def answered(self, key: str, model: Any, status: int, turn: int, body: Any = None) -> None:
        """Count the answer's status and append the request-log line (flushed; with the body when asked)."""
        with self._lock:
            self._by_status[str(status)] += 1
        if self.request_log:
            line = {
                "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "conversation": key,
                "model": model,
                "status": status,
                "turn": turn,
            }
            if self.log_bodies:
                line["body"] = body
            with _LOG_LOCK, open(self.request_log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")
                fh.flush()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self._requests,
                "by_conversation": dict(self._by_conversation),
                "by_status": dict(self._by_status),
                "in_flight": self._in_flight,
                "peak_in_flight": self._peak_in_flight,
            }

    def reset(self) -> None:
        with self._lock:
            self._by_conversation.clear()
            self._finals.clear()
            self._by_status.clear()
            self._requests = 0
            self._peak_in_flight = self._in_flight


class _AsciiJSON(JSONResponse):
    """A JSON answer with every non-ASCII character escaped, as ``json.dumps`` does by default (and
    many providers): it can carry a lone surrogate (``lone_surrogate``), which UTF-8 cannot."""

    def render(self, content: Any) -> bytes:
        """``content`` as compact ASCII JSON bytes."""
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def _error(
    status: int, message: str, type_: str, code: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": type_, "code": code, "param": None}},
        status_code=status,
        headers=headers,
    )


def _always_fails(options: MockOptions, key: str) -> bool:
    if options.fail_file is not None and not os.path.exists(options.fail_file):
        return False
    rate = options.fail_rate
    if rate is None:
        return options.fail_file is not None
    return unit_hash(options.seed, key, "fail") < rate


def _latency_s(options: MockOptions, key: str) -> float:
    if options.slow_rate > 0 and unit_hash(options.seed, key, "slow") < options.slow_rate:
        return options.slow_latency_ms / 1000
    return options.latency_ms / 1000


async def _answer(state: _State, body: Any, authorization: str = "") -> tuple[JSONResponse, str, Any, int]:
    """Answer one chat-completions request body: (response, conversation key, model, turn)."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        state.arrive(None)
        return (
            _error(400, "'messages' must be a list", "invalid_request_error", "invalid_request"),
            "",
            None,
            0,
        )
    messages = body["messages"]
    model = body.get("model")
    key = conversation_key(messages)
    turn = assistant_turns(messages)
    n = state.arrive(key)
    if not isinstance(model, str) or not is_mock_model(model):
        msg = f"The model {model!r} does not exist on the mock server (use a mock/... model id)"
        return _error(404, msg, "invalid_request_error", "model_not_found"), key, model, turn
    try:
        raw = {**model_id_options(model), **prompt_directives(message_text(first_user_content(messages)))}
        options = build_options(raw)
    except ConfigError as exc:
        return _error(400, str(exc), "invalid_request_error", "invalid_mock_option"), key, model, turn
    if body.get("stream"):
        msg = "stream=true is not supported by the mock model; send a non-streaming request"
        return _error(400, msg, "invalid_request_error", "stream_not_supported"), key, model, turn

    if options.echo_auth:
        msg = f"Incorrect API key provided: {authorization or '(none)'}"
        return _error(401, msg, "invalid_request_error", "invalid_api_key"), key, model, turn
    if options.max_in_flight and state.in_flight > options.max_in_flight:
        retry = f"{options.retry_after:g}"
        msg = (
            f"Too many requests in flight (mock max_in_flight={options.max_in_flight}); retry after {retry} s"
        )
        response = _error(429, msg, "rate_limit_error", "concurrency_limit", {"Retry-After": retry})
        return response, key, model, turn
    delay = _latency_s(options, key)
    if delay > 0:
        await asyncio.sleep(delay)
    hangs = options.hang_count if options.hang_s > 0 else 0
    if n < hangs:
        await asyncio.sleep(options.hang_s)
    if _always_fails(options, key):
        msg = f"mock failure: conversation {key} always fails (fail_rate/fail_file)"
        return _error(options.error_status, msg, "server_error", "mock_fail"), key, model, turn
    if n < hangs + options.rate_limit:
        retry = f"{options.retry_after:g}"
        msg = f"Rate limit exceeded (mock rate_limit={options.rate_limit}); retry after {retry} s"
        response = _error(429, msg, "rate_limit_error", "rate_limit_exceeded", {"Retry-After": retry})
        return response, key, model, turn
    if n < hangs + options.rate_limit + options.error_5xx:
        msg = f"mock server error {options.error_status} (error_5xx={options.error_5xx}, request {n})"
        return _error(options.error_status, msg, "server_error", "mock_error_5xx"), key, model, turn
    answers = options.answers.split("|") if options.answers else None
    final = (lambda: answers[state.next_final(key) % len(answers)]) if answers else None
    return _AsciiJSON(completion(body, options, key, n, model, final_answer=final)), key, model, turn


def create_app(request_log: str | None = None, log_bodies: bool = False) -> FastAPI:
    """A new mock-model app with its own counters.

    Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /stats``
    (``{"requests", "by_conversation", "by_status", "in_flight", "peak_in_flight"}``;
    ``by_status`` counts answered requests, ``peak_in_flight`` is the most requests served at
    once), ``POST /stats/reset`` (clears stats and the per-conversation counters).

    Args:
        request_log: file that gets one JSON line per chat-completions request
            (``time, conversation, model, status, turn``), appended and flushed.
        log_bodies: also write each request's decoded JSON body (``body``) into the log.
    """
    app = FastAPI(title="hermes mock model (test double)", docs_url=None, redoc_url=None, openapi_url=None)
    state = _State(request_log, log_bodies)
    app.state.mock = state

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        state.opened()
        try:
            response, key, model, turn = await _answer(state, body, request.headers.get("authorization", ""))
        finally:
            state.closed()
        state.answered(key, model, response.status_code, turn, body)
        return response

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "hermes-mock"} for m in MOCK_MODELS]
        return {"object": "list", "data": data}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return state.snapshot()

    @app.post("/stats/reset")
    async def stats_reset() -> dict[str, Any]:
        state.reset()
        return state.snapshot()

    return app


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # proto lets asyncio set TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class MockServer:
    """The mock model served by uvicorn in a daemon thread of this process.

    Examples:
        >>> with MockServer() as server:
        ...     server.base_url.startswith("http://127.0.0.1:")
        True

    Attributes:
        app: the FastAPI app (its counters are this server's).
        port: the bound port (known after :meth:`start`; ``port=0`` picks a free one).
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, request_log: str | None = None, log_bodies: bool = False
    ) -> None:
        self.host = host
        self.port = port
        self.app = create_app(request_log=request_log, log_bodies=log_bodies)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, the ``base_url`` for an OpenAI client."""
        return f"http://{_url_host(self.host)}:{self.port}/v1"

    def start(self, timeout: float = 10.0) -> MockServer:
        """Bind, serve in a daemon thread and wait until ``GET /v1/models`` answers; returns self.

        Raises:
            OSError: the address cannot be bound.
            RuntimeError: the server did not answer within ``timeout`` seconds.
        """
        if self._thread is not None:
            return self
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        # log_config=None: an embedded server must not reconfigure the host process's logging
        # (dictConfig would flush and drop Prefect's API log handler from a task thread).
        config = uvicorn.Config(
            self.app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"mockllm-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError("mock server thread exited during startup")
            if self._server.started:
                try:
                    if httpx.get(self.base_url + "/models", timeout=1.0).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"mock server did not answer on {self.base_url} within {timeout} s")

    def stop(self) -> None:
        """Stop serving and join the thread (open requests get about 1 s to finish)."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=5)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def stats(self) -> dict[str, Any]:
        """``{"requests": int, "by_conversation": {key: int}, "by_status": {"200": int, ...}}``."""
        return self.app.state.mock.snapshot()

    def __enter__(self) -> MockServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_shared_lock = threading.Lock()
_shared: MockServer | None = None
_shared_pid: int | None = None


def ensure_mock_server() -> str:
    """Base URL of the process-wide mock server, started on first call (thread-safe).

    If ``HERMES_MOCK_BASE_URL`` is set, that URL (a server started elsewhere, e.g.
    ``python -m hermes_core.mockllm``) is returned and nothing is started. If
    ``HERMES_MOCK_REQUEST_LOG`` is set when the server starts, it appends one JSON
    line per request to that file. A forked child process starts its own server.

    Raises:
        RuntimeError: the server could not start.
    """
    global _shared, _shared_pid
    external = os.environ.get("HERMES_MOCK_BASE_URL")
    if external:
        return external.rstrip("/")
    with _shared_lock:
        if _shared is None or _shared_pid != os.getpid():
            _shared = MockServer(request_log=os.environ.get("HERMES_MOCK_REQUEST_LOG") or None).start()
            _shared_pid = os.getpid()
        return _shared.base_url
