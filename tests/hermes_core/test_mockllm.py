"""The mock/ model over real HTTP: response shapes, tool plans, every fault option, stats, log, CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from hermes_core.mockllm import (
    MockOptions,
    MockServer,
    create_app,
    ensure_mock_server,
    is_mock_model,
    parse_model_options,
)

TERMINAL = {
    "type": "function",
    "function": {
        "name": "terminal",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "background": {"type": "boolean", "default": False},
                "timeout": {"type": "integer", "minimum": 1},
            },
            "required": ["command"],
        },
    },
}


def _fn(name: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


WRITE_FILE = _fn(
    "write_file", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]
)
READ_FILE = _fn(
    "read_file", {"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 1}}, ["path"]
)
SEARCH_FILES = _fn(
    "search_files",
    {"pattern": {"type": "string"}, "target": {"type": "string", "enum": ["content", "files"]}},
    ["pattern"],
)
WEB_EXTRACT = _fn(
    "web_extract", {"urls": {"type": "array", "items": {"type": "string"}, "maxItems": 5}}, ["urls"]
)
VISION = _fn(
    "vision_analyze",
    {"image_url": {"type": "string"}, "question": {"type": "string"}},
    ["image_url", "question"],
)
SCROLL = _fn("browser_scroll", {"direction": {"type": "string", "enum": ["up", "down"]}}, ["direction"])
FILE_TOOLS = [TERMINAL, WRITE_FILE, READ_FILE, SEARCH_FILES]


@pytest.fixture(scope="module")
def server():
    with MockServer() as srv:
        yield srv


@pytest.fixture
def client(server: MockServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


@pytest.fixture
def http(server: MockServer):
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        yield c


def _user(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": text}]


def _post(http: httpx.Client, model: str, messages: list[dict], **extra) -> httpx.Response:
    return http.post("/chat/completions", json={"model": model, "messages": messages, **extra})


def _reply_messages(messages: list[dict], message: dict, results: list[str]) -> list[dict]:
    """Append an assistant message (as returned) and one tool result per call."""
    out = [*messages, {k: v for k, v in message.items() if v is not None}]
    for call, result in zip(message.get("tool_calls") or [], results, strict=False):
        out.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return out


# ----------------------------------------------------------------------------- options


def test_is_mock_model():
    assert is_mock_model("mock/scripted")
    assert is_mock_model("mock/x?loop")
    assert not is_mock_model("anthropic/claude-sonnet-4.6")
    assert not is_mock_model("mock")


def test_parse_model_options_values_and_defaults():
    opts = parse_model_options("mock/scripted?latency_ms=200&fail_rate=0.1&seed=3&loop&reasoning=think")
    assert isinstance(opts, MockOptions)
    assert (opts.latency_ms, opts.fail_rate, opts.seed, opts.loop, opts.reasoning) == (
        200,
        0.1,
        3,
        True,
        "think",
    )
    plain = parse_model_options("mock/scripted")
    assert (plain.turns, plain.parallel, plain.retry_after, plain.error_status, plain.hang_count) == (
        2,
        1,
        1.0,
        500,
        1,
    )
    assert plain.rate_limit == plain.error_5xx == plain.bad_args == plain.unknown_tool == 0
    assert plain.fail_rate is None and plain.cost is None and not plain.no_reasoning


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("mock/scripted?bogus=1", "bogus"),
        ("mock/scripted?latency_ms=fast", "latency_ms"),
        ("mock/scripted?fail_rate=2", "fail_rate"),
        ("mock/scripted?reasoning=loud", "reasoning"),
        ("mock/scripted?error_status=404", "error_status"),
        ("openai/gpt-4o", "mock/"),
    ],
)
def test_parse_model_options_errors_name_the_option(model: str, named: str):
    with pytest.raises(ValueError, match=named):
        parse_model_options(model)


# ----------------------------------------------------------------------------- answers


def test_plain_answer_shape_with_openai_client(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="mock/scripted", messages=_user("What is the capital of France")
    )
    assert reply.object == "chat.completion"
    assert reply.model == "mock/scripted"
    assert reply.id.startswith("chatcmpl-mock-")
    choice = reply.choices[0]
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and not choice.message.tool_calls
    assert "What is the capital of France" in choice.message.content
    assert choice.message.model_extra["reasoning"]
    usage = reply.usage
    assert usage.prompt_tokens == (len("You are helpful.") + len("What is the capital of France")) // 4
    assert usage.completion_tokens >= 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens_details.reasoning_tokens >= 1
    assert "cost" not in (usage.model_extra or {})


def test_models_endpoint(client: openai.OpenAI):
    assert [m.id for m in client.models.list()] == ["mock/scripted"]


def test_tool_plan_runs_for_real(client: openai.OpenAI, tmp_path: Path):
    """Execute the mock's calls for real in tmp_path: the commands and files it asks for work."""
    messages = _user("Write a tiny greeting script")
    names = []
    for _ in range(10):
        reply = client.chat.completions.create(
            model="mock/scripted?turns=4", messages=messages, tools=FILE_TOOLS
        )
        message = reply.choices[0].message
        if reply.choices[0].finish_reason == "stop":
            break
        assert reply.choices[0].finish_reason == "tool_calls"
        results = []
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            names.append(call.function.name)
            if call.function.name == "terminal":
                proc = subprocess.run(
                    args["command"], shell=True, cwd=tmp_path, capture_output=True, text=True
                )
                assert proc.returncode == 0
                results.append(json.dumps({"output": proc.stdout, "exit_code": 0, "error": None}))
            elif call.function.name == "write_file":
                (tmp_path / args["path"]).write_text(args["content"])
                results.append(json.dumps({"bytes_written": len(args["content"])}))
            elif call.function.name == "read_file":
                results.append(json.dumps({"content": (tmp_path / args["path"]).read_text()}))
            else:
                assert call.function.name == "search_files" and args["pattern"]
                results.append(json.dumps({"total_count": 1, "matches": []}))
        messages = _reply_messages(messages, message.model_dump(), results)
    assert names == ["terminal", "write_file", "read_file", "search_files"]
    assert [c["id"] for m in messages if m["role"] == "assistant" for c in m["tool_calls"]] == [
        "call_0_0",
        "call_1_0",
        "call_2_0",
        "call_3_0",
    ]
    first = json.loads(messages[3]["content"])["output"]
    assert first.splitlines()[-1] == "Write a tiny greeting script"
    run = subprocess.run(
        [sys.executable, "solution.py"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert run.stdout == "WRITE A TINY GREETING SCRIPT\n5 words\n"
    assert reply.choices[0].finish_reason == "stop"
    assert "4 tool result(s)" in message.content


def test_terminal_only_plan_and_final_mentions_result(http: httpx.Client):
    messages = _user("check the machine")
    body = _post(http, "mock/scripted", messages, tools=[TERMINAL]).json()
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "terminal"
    assert json.loads(call["function"]["arguments"]) == {"command": 'ls -la && echo "check the machine"'}
    messages = _reply_messages(messages, body["choices"][0]["message"], ['{"output": "a.txt\\nb.txt"}'])
    body = _post(http, "mock/scripted", messages, tools=[TERMINAL]).json()
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"command": 'python3 -c "print(6*7)"'}
    messages = _reply_messages(messages, body["choices"][0]["message"], ['{"output": "42", "exit_code": 0}'])
    body = _post(http, "mock/scripted", messages, tools=[TERMINAL]).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["message"]["content"].endswith("The last one said: 42")


def test_generic_tools_get_arguments_from_schema(http: httpx.Client):
    messages = _user("Look at the sunset picture")
    calls = _post(http, "mock/scripted?parallel=3", messages, tools=[WEB_EXTRACT, VISION, SCROLL]).json()
    calls = calls["choices"][0]["message"]["tool_calls"]
    by_name = {c["function"]["name"]: json.loads(c["function"]["arguments"]) for c in calls}
    assert by_name == {
        "web_extract": {"urls": ["https://example.com/look-at-the-sunset-picture"]},
        "vision_analyze": {
            "image_url": "https://example.com/look-at-the-sunset-picture",
            "question": "Look at the sunset picture",
        },
        "browser_scroll": {"direction": "up"},
    }


def test_arguments_validate_against_the_tool_registry(http: httpx.Client):
    """Whatever tools of our registry are offered, the mock's calls name them and pass their validation."""
    from hermes_core.tools import REGISTRY

    for tool in REGISTRY.values():
        body = _post(
            http, "mock/scripted?parallel=4", _user(f"registry {tool.name}"), tools=[tool.schema()]
        ).json()
        for call in body["choices"][0]["message"]["tool_calls"]:
            assert call["function"]["name"] == tool.name
            tool.arguments_model.model_validate(json.loads(call["function"]["arguments"]))
    schemas = [t.schema() for t in REGISTRY.values()]
    messages = _user("use everything you have")
    for _ in range(2):
        message = _post(http, "mock/scripted?parallel=4", messages, tools=schemas).json()["choices"][0][
            "message"
        ]
        for call in message["tool_calls"]:
            REGISTRY[call["function"]["name"]].arguments_model.model_validate(
                json.loads(call["function"]["arguments"])
            )
        messages = _reply_messages(messages, message, ['{"output": "ok"}'] * 4)


def test_tool_choice_none_gives_an_answer(http: httpx.Client):
    body = _post(http, "mock/scripted", _user("no tools please"), tools=[TERMINAL], tool_choice="none").json()
    assert body["choices"][0]["finish_reason"] == "stop"


def test_parallel_calls(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="mock/scripted?parallel=3", messages=_user("do three things"), tools=FILE_TOOLS
    )
    calls = reply.choices[0].message.tool_calls
    assert [c.id for c in calls] == ["call_0_0", "call_0_1", "call_0_2"]
    assert [c.function.name for c in calls] == ["terminal", "write_file", "read_file"]
    assert all(isinstance(json.loads(c.function.arguments), dict) for c in calls)


def test_cost(client: openai.OpenAI):
    reply = client.chat.completions.create(model="mock/scripted?cost=0.001", messages=_user("how much"))
    assert reply.usage.model_extra["cost"] == 0.001


# ----------------------------------------------------------------------------- reasoning


@pytest.mark.parametrize(
    ("style", "check"),
    [
        ("field", lambda m: isinstance(m["reasoning"], str) and m["reasoning"]),
        ("reasoning_content", lambda m: m["reasoning_content"] and "reasoning" not in m),
        (
            "details",
            lambda m: (
                m["reasoning_details"][0]["type"] == "reasoning.text" and m["reasoning_details"][0]["text"]
            ),
        ),
        ("think", lambda m: m["content"].startswith("<think>\n") and "\n</think>\n" in m["content"]),
        (
            "scratchpad",
            lambda m: (
                m["content"].startswith("<REASONING_SCRATCHPAD>\n")
                and "</REASONING_SCRATCHPAD>\n" in m["content"]
            ),
        ),
    ],
)
def test_reasoning_styles(http: httpx.Client, style: str, check):
    for tools in ([], [TERMINAL]):
        extra = {"tools": tools} if tools else {}
        message = _post(http, f"mock/scripted?reasoning={style}", _user(f"reason {style}"), **extra).json()
        assert check(message["choices"][0]["message"])


def test_no_reasoning(http: httpx.Client):
    for tools in ([], [TERMINAL]):
        extra = {"tools": tools} if tools else {}
        body = _post(http, "mock/scripted?no_reasoning&reasoning=think", _user("plain reply"), **extra).json()
        message = body["choices"][0]["message"]
        assert not {"reasoning", "reasoning_content", "reasoning_details"} & set(message)
        assert "<think>" not in message["content"]
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


# ----------------------------------------------------------------------------- faults


def test_rate_limit_then_ok(http: httpx.Client):
    model = "mock/scripted?rate_limit=2&retry_after=3"
    messages = _user("rate limited prompt")
    for _ in range(2):
        resp = _post(http, model, messages)
        assert resp.status_code == 429
        assert resp.headers["Retry-After"] == "3"
        assert resp.json()["error"]["type"] == "rate_limit_error"
        assert resp.json()["error"]["code"] == "rate_limit_exceeded"
    assert _post(http, model, messages).status_code == 200


def test_rate_limit_seen_by_openai_client(client: openai.OpenAI):
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="mock/scripted?rate_limit=1", messages=_user("openai 429"))
    assert info.value.response.headers["retry-after"] == "1"


def test_error_5xx_then_ok(http: httpx.Client):
    model = "mock/scripted?error_5xx=2&error_status=503"
    messages = _user("flaky provider")
    statuses = [_post(http, model, messages).status_code for _ in range(3)]
    assert statuses == [503, 503, 200]


def test_rate_limit_and_5xx_stack(http: httpx.Client):
    model = "mock/scripted?rate_limit=1&error_5xx=1"
    statuses = [_post(http, model, _user("stacked faults")).status_code for _ in range(3)]
    assert statuses == [429, 500, 200]


def test_fail_rate_selects_a_deterministic_subset(http: httpx.Client):
    def failing(seed: int) -> set[int]:
        model = f"mock/scripted?fail_rate=0.3&seed={seed}"
        return {i for i in range(100) if _post(http, model, _user(f"sample {i}")).status_code == 500}

    first = failing(7)
    assert 15 <= len(first) <= 45
    assert failing(7) == first  # every request of a selected conversation fails, the others never do
    assert failing(8) != first


def test_fail_file_gate(http: httpx.Client, tmp_path: Path):
    gate = tmp_path / "failing"
    gate.touch()
    model = f"mock/scripted?fail_file={gate}"
    resp = _post(http, model, _user("gated failure"))
    assert resp.status_code == 500 and resp.json()["error"]["code"] == "mock_fail"
    gate.unlink()
    assert _post(http, model, _user("gated failure")).status_code == 200
    rated = f"mock/scripted?fail_file={gate}&fail_rate=1"
    assert _post(http, rated, _user("gated failure")).status_code == 200


def test_hang_makes_the_client_time_out(server: MockServer):
    model = "mock/scripted?hang_s=1.5"
    messages = _user("hanging request")
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model=model, messages=messages)
    started = time.monotonic()
    reply = client.chat.completions.create(model=model, messages=messages)
    assert reply.choices[0].finish_reason == "stop"
    assert time.monotonic() - started < 0.3


def test_bad_args_first_turn_only(http: httpx.Client):
    messages = _user("bad json please")
    message = _post(http, "mock/scripted?bad_args=1", messages, tools=[TERMINAL]).json()["choices"][0][
        "message"
    ]
    arguments = message["tool_calls"][0]["function"]["arguments"]
    assert arguments.startswith('{"command": ')
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    messages = _reply_messages(messages, message, ['{"error": "invalid JSON arguments"}'])
    message = _post(http, "mock/scripted?bad_args=1", messages, tools=[TERMINAL]).json()["choices"][0][
        "message"
    ]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"])["command"]


def test_unknown_tool(http: httpx.Client):
    messages = _user("call something odd")
    body = _post(http, "mock/scripted?unknown_tool=1", messages, tools=FILE_TOOLS).json()
    message = body["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "hallucinated_tool"
    messages = _reply_messages(messages, message, ['{"error": "Unknown tool: hallucinated_tool"}'])
    body = _post(http, "mock/scripted?unknown_tool=1", messages, tools=FILE_TOOLS).json()
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "write_file"


def test_loop_never_answers(http: httpx.Client):
    messages = _user("loop forever")
    for k in range(6):
        body = _post(http, "mock/scripted?loop&turns=0", messages, tools=[TERMINAL]).json()
        assert body["choices"][0]["finish_reason"] == "tool_calls"
        assert body["choices"][0]["message"]["tool_calls"][0]["id"] == f"call_{k}_0"
        messages = _reply_messages(messages, body["choices"][0]["message"], ['{"output": "x"}'])


def test_turns_option(http: httpx.Client):
    body = _post(http, "mock/scripted?turns=0", _user("answer at once"), tools=[TERMINAL]).json()
    assert body["choices"][0]["finish_reason"] == "stop"


def test_length(client: openai.OpenAI):
    reply = client.chat.completions.create(model="mock/scripted?length", messages=_user("a long story"))
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content


def test_directives_in_prompt_override_model_options(http: httpx.Client):
    messages = _user("[mock:rate_limit=1,no_reasoning,turns=1] Summarise the news")
    assert _post(http, "mock/scripted?turns=0", messages).status_code == 429
    body = _post(http, "mock/scripted?turns=0", messages, tools=[TERMINAL]).json()
    message = body["choices"][0]["message"]
    assert "reasoning" not in message
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "command": 'ls -la && echo "Summarise the news"'
    }


def test_bad_directive_is_a_400(http: httpx.Client):
    resp = _post(http, "mock/scripted", _user("[mock:parallel=lots] hi"))
    assert resp.status_code == 400 and "parallel" in resp.json()["error"]["message"]


def test_invalid_option_and_stream_are_400(client: openai.OpenAI, http: httpx.Client):
    with pytest.raises(openai.BadRequestError, match="latency_ms"):
        client.chat.completions.create(model="mock/scripted?latency_ms=soon", messages=_user("bad option"))
    resp = _post(http, "mock/scripted?wat=1", _user("bad option"))
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert "wat" in error["message"] and error["type"] == "invalid_request_error"
    resp = _post(http, "mock/scripted", _user("stream it"), stream=True)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "stream_not_supported"
    assert _post(http, "gpt-4o", _user("wrong model")).status_code == 404


def test_latency_requests_overlap():
    async def run(server: MockServer) -> float:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as c:
            started = time.monotonic()
            replies = await asyncio.gather(
                *(
                    c.post(
                        "/chat/completions",
                        json={"model": "mock/scripted?latency_ms=300", "messages": _user(f"concurrent {i}")},
                    )
                    for i in range(20)
                )
            )
            assert [r.status_code for r in replies] == [200] * 20
            return time.monotonic() - started

    with MockServer() as own:  # its own counters
        elapsed = asyncio.run(run(own))
        stats = own.stats()
    # one after another they would take 20 x 0.3 = 6 s; generous for a loaded CI machine (xdist workers)
    assert 0.3 <= elapsed < 4.0
    assert stats["peak_in_flight"] == 20 and stats["in_flight"] == 0


def test_max_in_flight_refuses_the_extra_requests_like_a_provider_limit():
    async def run(server: MockServer) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as c:
            model = "mock/scripted?max_in_flight=4&latency_ms=300&retry_after=0.7"
            return await asyncio.gather(
                *(
                    c.post("/chat/completions", json={"model": model, "messages": _user(f"limited {i}")})
                    for i in range(10)
                )
            )

    with MockServer() as own:
        replies = asyncio.run(run(own))
        stats = own.stats()
        later = httpx.post(  # the limit is on requests in flight: once they are answered, room again
            own.base_url + "/chat/completions",
            json={"model": "mock/scripted?max_in_flight=4", "messages": _user("after")},
            timeout=10,
        )
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200] * 4 + [429] * 6
    refused = [r for r in replies if r.status_code == 429]
    assert all(r.headers["retry-after"] == "0.7" for r in refused)
    assert refused[0].json()["error"]["code"] == "concurrency_limit"
    assert stats["by_status"] == {"200": 4, "429": 6} and later.status_code == 200


def test_slow_rate(http: httpx.Client):
    started = time.monotonic()
    assert _post(http, "mock/scripted?slow_rate=1&slow_latency_ms=300", _user("slow one")).status_code == 200
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    assert _post(http, "mock/scripted?slow_rate=0&slow_latency_ms=3000", _user("fast one")).status_code == 200
    assert time.monotonic() - started < 1.0


# ----------------------------------------------------------------------------- stats, log, processes


def test_stats_and_request_log(tmp_path: Path):
    log = tmp_path / "requests.jsonl"
    with MockServer(request_log=str(log)) as srv, httpx.Client(base_url=srv.base_url) as c:
        messages = _user("counted prompt")
        statuses = [_post(c, "mock/scripted?rate_limit=1", messages).status_code for _ in range(2)]
        assert statuses == [429, 200]
        body = _post(c, "mock/scripted", messages, tools=[TERMINAL]).json()
        messages = _reply_messages(messages, body["choices"][0]["message"], ['{"output": "ok"}'])
        assert _post(c, "mock/scripted", messages, tools=[TERMINAL]).status_code == 200
        assert _post(c, "mock/scripted?oops=1", _user("other prompt")).status_code == 400
        stats = srv.stats()
        assert stats == httpx.get(srv.base_url.removesuffix("/v1") + "/stats").json()
        assert stats["requests"] == 5
        assert stats["in_flight"] == 0 and stats["peak_in_flight"] == 1  # one request at a time
        assert sorted(stats["by_conversation"].values()) == [1, 4]
        assert stats["by_status"] == {"429": 1, "200": 3, "400": 1}
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert [(line["status"], line["turn"]) for line in lines] == [
            (429, 0),
            (200, 0),
            (200, 0),
            (200, 1),
            (400, 0),
        ]
        assert lines[0]["model"] == "mock/scripted?rate_limit=1"
        assert len(lines[0]["conversation"]) == 16 and set(lines[0]) == {
            "time",
            "conversation",
            "model",
            "status",
            "turn",
        }
        reset = httpx.post(srv.base_url.removesuffix("/v1") + "/stats/reset").json()
        assert reset == {
            "requests": 0, "by_conversation": {}, "by_status": {}, "in_flight": 0, "peak_in_flight": 0
        }  # fmt: skip
        assert _post(c, "mock/scripted?rate_limit=1", _user("counted prompt")).status_code == 429


def test_create_app_is_independent():
    assert create_app() is not create_app()


def test_ensure_mock_server_is_one_per_process(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HERMES_MOCK_BASE_URL", raising=False)
    urls: list[str] = []
    threads = [threading.Thread(target=lambda: urls.append(ensure_mock_server())) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(urls) == 12 and len(set(urls)) == 1
    client = openai.OpenAI(base_url=urls[0], api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="mock/scripted", messages=_user("shared server"))
    assert reply.choices[0].finish_reason == "stop"


def test_ensure_mock_server_request_log_env(tmp_path: Path):
    log = tmp_path / "shared.jsonl"
    code = (
        "import openai; from hermes_core.mockllm import ensure_mock_server as e; "
        "c = openai.OpenAI(base_url=e(), api_key='x', max_retries=0); "
        "[c.chat.completions.create(model='mock/scripted', messages=[{'role': 'user', 'content': 'env log'}]) "
        "for _ in range(3)]; print(e())"
    )
    env = {k: v for k, v in os.environ.items() if k != "HERMES_MOCK_BASE_URL"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "HERMES_MOCK_REQUEST_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("http://127.0.0.1:")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["status"] for line in lines] == [200, 200, 200]
    assert len({line["conversation"] for line in lines}) == 1


def test_module_cli_serves_then_terminates(tmp_path: Path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "cli.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_core.mockllm", "--port", str(port), "--request-log", str(log)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        base_url = proc.stdout.readline().strip()
        assert base_url == f"http://127.0.0.1:{port}/v1"
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10)
        reply = client.chat.completions.create(model="mock/scripted", messages=_user("from a subprocess"))
        assert "from a subprocess" in reply.choices[0].message.content
        assert json.loads(log.read_text())["status"] == 200
    finally:
        proc.terminate()
        # uvicorn shuts down gracefully, then re-raises the captured SIGTERM
        assert proc.wait(timeout=10) in (0, -signal.SIGTERM)
