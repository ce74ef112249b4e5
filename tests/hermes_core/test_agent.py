"""The agent loop end to end: real HTTP to the mock model, real shell commands in a local sandbox."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hermes_core.agent import AgentConfig
from hermes_core.cancel import hold_new_prompts
from hermes_core.client import HttpClients, ModelClient, ModelOptions
from hermes_core.exceptions import ModelError, PromptCancelled, PromptTimeout
from hermes_core.mockllm import MockServer
from hermes_core.runner import PromptJob, RunSpec, run_prompt
from hermes_core.settings import HermesSettings
from hermes_core.tools import ALL_POSSIBLE_TOOLS


def _job(prompt: str, index: int = 0) -> PromptJob:
    key = f"test-{abs(hash(prompt)) % 10**12:012d}"
    return PromptJob(prompt_index=index, prompt_id=key, record_key=key, prompt=prompt)


def _spec(
    server, model: str = "mock/scripted", *, toolsets=("terminal",), max_turns: int = 10, **kw
) -> RunSpec:
    return RunSpec(
        run_name="t",
        model=ModelOptions(model=model, **kw.pop("model_options", {})),
        agent=AgentConfig(max_turns=max_turns, **kw.pop("agent", {})),
        base_url=server.base_url,
        toolsets=list(toolsets) if toolsets is not None else None,
        **kw,
    )


SETTINGS = HermesSettings(api_key=None, max_retries=2, request_timeout=30)


def _requests_for(server, prompt: str) -> int:
    import hashlib

    key = hashlib.sha256(prompt.encode()).hexdigest()[:16]
    return server.stats()["by_conversation"].get(key, 0)


def test_tool_calls_run_real_commands_and_usage_is_summed(mock_server):
    prompt = "Compute something with the shell (usage test)"
    outcome = run_prompt(_job(prompt), _spec(mock_server, "mock/scripted?cost=0.001"), SETTINGS)
    row = outcome.row
    assert outcome.status == "kept"
    assert row["completed"] is True and row["partial"] is False
    assert row["api_calls"] == 3  # two tool-calling turns, then the answer
    froms = [t["from"] for t in row["conversations"]]
    assert froms == ["system", "human", "gpt", "tool", "gpt", "tool", "gpt"]
    assert row["conversations"][1]["value"] == prompt
    listed = json.loads(row["conversations"][0]["value"].split("<tools>\n", 1)[1].split("\n</tools>", 1)[0])
    assert [list(entry) for entry in listed] == [["name", "description", "parameters", "required"]] * 2
    assert [(e["name"], e["required"], e["parameters"]["required"]) for e in listed] == [
        ("terminal", None, ["command"]),
        ("process", None, ["action"]),
    ]
    # the second command is python3 -c "print(6*7)": its real output is in the tool turn
    second_tool = row["conversations"][5]["value"]
    assert second_tool.startswith("<tool_response>\n") and '"output": "42"' in second_tool
    assert row["tool_stats"]["terminal"] == {"count": 2, "success": 2, "failure": 0}
    assert list(row["tool_stats"]) == list(ALL_POSSIBLE_TOOLS)
    assert row["metadata"]["usage"]["cost"] == pytest.approx(0.003)
    assert row["metadata"]["usage"]["prompt_tokens"] > 0
    assert row["metadata"]["reasoning"] == {"assistant_turns": 3, "turns_with_reasoning": 3}
    assert row["toolsets_used"] == ["terminal"]
    assert _requests_for(mock_server, prompt) == 3


def test_no_tools_offered_gives_a_direct_answer(mock_server):
    outcome = run_prompt(
        _job("Say hello without tools"), _spec(mock_server, toolsets=None, distribution="minimal"), SETTINGS
    )
    row = outcome.row
    assert [t["from"] for t in row["conversations"]] == ["system", "human", "gpt"]
    assert row["api_calls"] == 1
    assert row["toolsets_used"] == ["web"]  # drawn, but the web backend is not configured: nothing offered
    assert "<tools>\n[]\n</tools>" in row["conversations"][0]["value"]


def test_rate_limit_is_retried_honouring_retry_after(mock_server):
    prompt = "Rate limited prompt"
    started = time.monotonic()
    outcome = run_prompt(
        _job(prompt), _spec(mock_server, "mock/scripted?rate_limit=2&retry_after=1.5"), SETTINGS
    )
    elapsed = time.monotonic() - started
    assert outcome.status == "kept" and outcome.row["api_calls"] == 3
    assert _requests_for(mock_server, prompt) == 5  # 2 x 429, then 3 answered calls
    assert elapsed >= 3.0  # two waits of Retry-After = 1.5 s, not the SDK's 0.5-1 s default backoff


def test_server_errors_after_retries_fail_the_prompt(mock_server):
    prompt = "Always failing prompt"
    with pytest.raises(ModelError) as info:
        run_prompt(_job(prompt), _spec(mock_server, "mock/scripted?error_5xx=10&error_status=503"), SETTINGS)
    assert info.value.status_code == 503 and info.value.retryable is True
    assert _requests_for(mock_server, prompt) == 3  # 1 + max_retries=2


def test_non_retryable_4xx_carries_the_provider_message(mock_server):
    prompt = "Bad request prompt"
    with pytest.raises(ModelError) as info:
        run_prompt(_job(prompt), _spec(mock_server, "mock/scripted?no_such_option=1"), SETTINGS)
    assert info.value.status_code == 400 and info.value.retryable is False
    assert "no_such_option" in str(info.value)


def test_timeout_is_retried(mock_server):
    settings = HermesSettings(max_retries=1, request_timeout=1.0)
    prompt = "Hanging first request"
    outcome = run_prompt(_job(prompt), _spec(mock_server, "mock/scripted?hang_s=4&hang_count=1"), settings)
    assert outcome.status == "kept" and outcome.row["api_calls"] == 3
    assert _requests_for(mock_server, prompt) == 4


def test_invalid_arguments_three_in_a_row_end_partial(mock_server):
    outcome = run_prompt(
        _job("Bad arguments x3"), _spec(mock_server, "mock/scripted?bad_args=3&turns=5"), SETTINGS
    )
    row = outcome.row
    assert row["partial"] is True and row["completed"] is True
    assert row["metadata"]["stop_reason"] == "RepeatedToolErrors"
    assert row["api_calls"] == 3
    assert row["tool_error_counts"]["terminal"] == 3
    tool_turn = row["conversations"][3]["value"]
    assert "Invalid JSON arguments for terminal" in tool_turn


def test_invalid_arguments_then_recovery_completes(mock_server):
    outcome = run_prompt(
        _job("Bad arguments x2"), _spec(mock_server, "mock/scripted?bad_args=2&turns=3"), SETTINGS
    )
    row = outcome.row
    assert row["partial"] is False and row["completed"] is True and row["api_calls"] == 4
    assert row["tool_stats"]["terminal"] == {"count": 3, "success": 1, "failure": 2}


def test_unknown_tool_is_reported_back_and_counted_under_its_name(mock_server):
    outcome = run_prompt(
        _job("Unknown tool x1"), _spec(mock_server, "mock/scripted?unknown_tool=1&turns=2"), SETTINGS
    )
    row = outcome.row
    assert row["partial"] is False
    hallucinated = [name for name in row["tool_stats"] if name not in ALL_POSSIBLE_TOOLS]
    assert len(hallucinated) == 1 and row["tool_stats"][hallucinated[0]]["failure"] == 1
    assert f"Unknown tool: {hallucinated[0]}" in row["conversations"][3]["value"]


def test_endless_tool_loop_hits_the_turn_limit(mock_server):
    outcome = run_prompt(
        _job("Loop forever"), _spec(mock_server, "mock/scripted?loop", max_turns=4), SETTINGS
    )
    row = outcome.row
    assert row["completed"] is False and row["partial"] is False and row["api_calls"] == 4
    assert row["metadata"]["stop_reason"] == "TurnLimitReached"
    assert row["conversations"][-1]["from"] == "tool"


def test_length_cut_is_partial(mock_server):
    outcome = run_prompt(_job("Cut by length"), _spec(mock_server, "mock/scripted?length"), SETTINGS)
    assert outcome.row["partial"] is True and outcome.row["completed"] is True
    assert outcome.row["metadata"]["stop_reason"] == "OutputTruncated"


def test_no_reasoning_is_discarded(mock_server):
    outcome = run_prompt(
        _job("No reasoning at all"), _spec(mock_server, "mock/scripted?no_reasoning"), SETTINGS
    )
    assert outcome.status == "discarded"
    assert outcome.turns_with_reasoning == 0 and outcome.assistant_turns == 3
    assert outcome.row["conversations"][2]["value"].startswith("<think>\n</think>\n")


@pytest.mark.parametrize("style", ["field", "reasoning_content", "details", "think", "scratchpad"])
def test_every_reasoning_style_lands_in_think_blocks(mock_server, style):
    outcome = run_prompt(
        _job(f"Reasoning style {style}"), _spec(mock_server, f"mock/scripted?reasoning={style}"), SETTINGS
    )
    assert outcome.status == "kept" and outcome.turns_with_reasoning == 3
    first_gpt = outcome.row["conversations"][2]["value"]
    assert first_gpt.startswith("<think>\nTurn 0")
    assert "REASONING_SCRATCHPAD" not in first_gpt and first_gpt.count("<think>") == 1


def test_prompt_deadline_fails_the_prompt(mock_server):
    spec = _spec(mock_server, "mock/scripted?latency_ms=1200&turns=3", prompt_timeout=2.0)
    with pytest.raises(PromptTimeout):
        run_prompt(_job("Slow prompt with deadline"), spec, SETTINGS)


class _Recorder(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Recorder.bodies.append(body)
        reply = {
            "id": "r1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Fine.", "reasoning": "Thinking."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9, "cost": 0.5},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_request_body_has_routing_reasoning_and_unstored_prompts():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = RunSpec(
            model=ModelOptions(
                model="some/model",
                max_tokens=321,
                temperature=0.7,
                top_p=0.9,
                providers_allowed=["a", "b"],
                providers_order=["b"],
                provider_sort="price",
                reasoning_effort="high",
            ),
            agent=AgentConfig(
                ephemeral_system_prompt="SECRET SYSTEM",
                prefill_messages=[
                    {"role": "user", "content": "few"},
                    {"role": "assistant", "content": "shot"},
                ],
            ),
            base_url=f"http://127.0.0.1:{server.server_port}/v1",
            toolsets=["terminal"],
        )
        outcome = run_prompt(
            _job("Recorded prompt"), spec, HermesSettings(api_key="sk-test-123", max_retries=0)
        )
    finally:
        server.shutdown()
    body = _Recorder.bodies[-1]
    assert body["max_tokens"] == 321
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9)
    assert body["provider"] == {"only": ["a", "b"], "order": ["b"], "sort": "price"}
    assert body["reasoning"] == {"enabled": True, "effort": "high"}
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert (
        body["messages"][0]["content"] == "SECRET SYSTEM"
        and body["messages"][3]["content"] == "Recorded prompt"
    )
    assert [t["function"]["name"] for t in body["tools"]] == ["terminal", "process"]
    text = json.dumps(outcome.row)
    assert "SECRET SYSTEM" not in text and '"few"' not in text and "sk-test-123" not in text
    assert outcome.row["metadata"]["usage"] == {
        "prompt_tokens": 7, "completion_tokens": 2, "reasoning_tokens": 0, "cost": 0.5
    }  # fmt: skip


def test_reasoning_disabled_wins_over_effort():
    options = ModelOptions(model="m", reasoning_effort="high", reasoning_disabled=True)
    assert options.extra_body() == {"reasoning": {"effort": "none"}}
    assert ModelOptions(model="m").extra_body() == {}


def _cancel_in_a_child(mock_server, prompt: str, wait_file: str, model: str = "mock/scripted") -> dict:
    """Run ``tests/fixtures/cancel_child.py`` (one prompt, then cancel_running) and return its report."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.cancel_child", mock_server.base_url, prompt, wait_file, model],
        cwd=repo, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cancel_running_stops_prompts_and_kills_their_commands(mock_server, tmp_path):
    from tests.conftest import host_pids_with

    marker = f"60.{time.monotonic_ns() % 10**6}"  # a unique sleep argument, seen on the host's /proc
    prompt = f"[mock:command=sh -c 'exec sleep {marker}'] cancel me"
    report = _cancel_in_a_child(mock_server, prompt, f"process:{marker}")
    assert report["closed"] == 1 and report["alive"] is False and report["seconds"] < 10
    assert report["error"] == "PromptCancelled"
    assert report["after_cancel"] == "PromptCancelled"  # new prompts refuse while cancelled
    assert report["after_reset"] == "kept"  # until reset(): what a new flow run in the process does first
    deadline = time.monotonic() + 3
    while host_pids_with(f"sleep\0{marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_pids_with(f"sleep\0{marker}") == []


def test_cancel_does_not_wait_for_a_hanging_model_request(mock_server):
    # the model request hangs 30 s; the cancel must end the prompt at once, not after the request
    report = _cancel_in_a_child(mock_server, "hanging request, then cancel", "-", "mock/scripted?hang_s=30")
    assert report["error"] == "PromptCancelled" and report["alive"] is False
    assert report["seconds"] < 2
    assert report["after_reset"] == "kept"


def test_prompt_timeout_bounds_client_retries(mock_server):
    # every request answers 429 with Retry-After 2 s: without the deadline, 5 retries would take 10 s
    settings = HermesSettings(api_key=None, max_retries=5, request_timeout=30)
    spec = _spec(mock_server, "mock/scripted?rate_limit=50&retry_after=2").model_copy(
        update={"prompt_timeout": 3}
    )
    started = time.monotonic()
    with pytest.raises(PromptTimeout):
        run_prompt(_job("Deadline during retries"), spec, settings)
    assert time.monotonic() - started < 3.5
    assert (
        _requests_for(mock_server, "Deadline during retries") == 2
    )  # the 3rd would start after the deadline


class _RawReply(BaseHTTPRequestHandler):
    """Answers 200 (application/json) with ``reply`` as it is: bodies a provider should not send."""

    reply = b""

    def do_POST(self):  # noqa: N802 - http.server API
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.reply)))
        self.end_headers()
        self.wfile.write(self.reply)

    def log_message(self, *args):
        pass


def _complete_with_reply(reply: object):
    _RawReply.reply = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RawReply)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ModelClient(
            ModelOptions(model="some/model"),
            base_url=f"http://127.0.0.1:{server.server_port}/v1",
            api_key=None,
            max_retries=0,
        )
        return client.complete([{"role": "user", "content": "hi"}], [], timeout=5)
    finally:
        server.shutdown()


def _message(**fields) -> dict:
    return {"choices": [{"message": {"role": "assistant", **fields}, "finish_reason": "tool_calls"}]}


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        # OpenRouter answers 200 with an error object when a provider fails mid-way
        (
            {"error": {"message": "upstream provider overloaded", "code": 502}},
            "the provider returned no choices: upstream provider overloaded",
        ),
        (b'{"choices": [{"message": {"content": "cut o', "the provider's reply is not valid JSON"),
        ({"choices": {"0": {}}}, "the provider returned a malformed response (KeyError"),
        (_message(content=None, tool_calls=7), "the provider returned a malformed response (TypeError"),
        (
            _message(content=None, tool_calls=[{"id": "c", "function": "terminal"}]),
            "malformed response (AttributeError",
        ),
        (
            {**_message(content="x"), "usage": "lots"},
            "the provider returned a malformed response (ValueError",
        ),
    ],
)
def test_a_malformed_reply_is_a_retryable_model_error_that_says_what_came(reply, error):
    with pytest.raises(ModelError) as caught:
        _complete_with_reply(reply)
    assert caught.value.retryable is True
    assert error in str(caught.value)


def test_tool_call_arguments_sent_as_a_json_object_become_json_text():
    turn = _complete_with_reply(
        _message(
            content=None,
            tool_calls=[{"id": "c1", "function": {"name": "terminal", "arguments": {"command": "ls"}}}],
        )
    )
    assert turn.message["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}
    ]


def test_toolset_draw_is_paired_across_models_and_turn_limits(mock_server, tmp_path):
    """A model comparison keeps every prompt's tools: the draw depends on (seed, record), not the settings."""
    from hermes_core.dataset import read_dataset
    from hermes_core.runfolder.run_info import jobs_of

    dataset = tmp_path / "paired.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Paired prompt {i}"}) + "\n" for i in range(12)))
    records = read_dataset(dataset)
    drawn = {}
    # turns=0: the mock answers at once, so no tool (browser, web ...) runs: only the draw is compared
    for model, max_turns in [
        ("mock/scripted?turns=0", 2),
        ("mock/scripted?turns=0&latency_ms=1", 2),
        ("mock/scripted?turns=0", 3),
    ]:
        spec = _spec(mock_server, model, toolsets=None, max_turns=max_turns, distribution="balanced")
        jobs = jobs_of(records, settings_hash=f"{model}|{max_turns}")
        drawn[(model, max_turns)] = [run_prompt(job, spec, SETTINGS).row["toolsets_used"] for job in jobs]
    first, *others = drawn.values()
    assert all(other == first for other in others)
    assert len({tuple(ts) for ts in first}) > 1  # the draw does vary from prompt to prompt
    ids = {job.prompt_id for job in jobs_of(records, "a")} & {job.prompt_id for job in jobs_of(records, "b")}
    assert not ids  # while the prompts' identities (cache, ledger) do differ between the runs


def test_repeated_tool_errors_mid_turn_leave_no_call_without_a_result(mock_server):
    # 4 calls per turn, all with invalid arguments: the 3rd ends the run; the 4th still gets a result
    outcome = run_prompt(
        _job("Parallel bad calls"), _spec(mock_server, "mock/scripted?bad_args=1&parallel=4"), SETTINGS
    )
    row = outcome.row
    assert row["metadata"]["stop_reason"] == "RepeatedToolErrors" and row["partial"] is True
    tool_turn = row["conversations"][3]["value"]
    assert tool_turn.count("<tool_response>") == 4
    assert "Not run: the turn ended after repeated malformed tool calls" in tool_turn
    assert sum(v["failure"] for v in row["tool_stats"].values()) == 4


def test_a_tool_call_without_an_id_gets_one():
    turn = _complete_with_reply(
        _message(content=None, tool_calls=[{"function": {"name": "terminal", "arguments": "{}"}}])
    )
    call_id = turn.message["tool_calls"][0]["id"]
    assert isinstance(call_id, str) and call_id.startswith("call_") and len(call_id) == 21


def test_openrouter_requests_ask_for_the_cost_others_do_not(tmp_path):
    import openai
    from pydantic import SecretStr

    from hermes_core.mockllm import MockServer

    log = tmp_path / "bodies.jsonl"
    with MockServer(request_log=str(log), log_bodies=True) as server:
        sent = []
        for base in ("https://openrouter.ai/api/v1", server.base_url):
            client = ModelClient(
                ModelOptions(model="mock/scripted?cost=0.002"), base_url=base, api_key=SecretStr("k")
            )
            client.http = HttpClients(
                lambda: openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
            )  # the mock answers
            sent.append(client.complete([{"role": "user", "content": f"cost asked? {base}"}], []))
    bodies = [json.loads(line)["body"] for line in log.read_text().splitlines()]
    assert bodies[0]["usage"] == {"include": True} and "usage" not in bodies[1]
    assert sent[0].usage.cost == pytest.approx(0.002)


class _WindowSpent(_Recorder):
    """Answers like a provider whose request window is used up: remaining 0, reset in 1 s."""

    arrivals: list[float] = []

    def send_header(self, keyword, value):
        super().send_header(keyword, value)
        if keyword == "Content-Type":
            super().send_header("x-ratelimit-remaining-requests", "0")
            super().send_header("x-ratelimit-reset-requests", "1s")

    def do_POST(self):  # noqa: N802 - http.server API
        _WindowSpent.arrivals.append(time.monotonic())
        super().do_POST()


def test_ratelimit_headers_hold_the_next_request_until_the_reset():
    from pydantic import SecretStr

    from hermes_core.limiter import ConcurrencyLimiter

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _WindowSpent)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        limiter = ConcurrencyLimiter(4)
        client = ModelClient(
            ModelOptions(model="any"),
            base_url=f"http://127.0.0.1:{httpd.server_port}/v1",
            api_key=SecretStr("k"),
            limiter=limiter,
        )
        for i in range(2):
            client.complete([{"role": "user", "content": f"window {i}"}], [])
    finally:
        httpd.shutdown()
    first, second = _WindowSpent.arrivals[-2:]
    assert second - first >= 0.95  # held until x-ratelimit-reset-requests passed
    assert limiter.limit == 4 and limiter.rate_limited == 0  # a hold, not a cut


def test_concurrent_requests_spread_over_http_clients_of_bounded_size():
    """70 requests at once through one ModelClient: 3 HTTP clients (32 + 32 + 6), all in flight together."""
    from concurrent.futures import ThreadPoolExecutor

    from hermes_core.client import REQUESTS_PER_HTTP_CLIENT
    from hermes_core.mockllm import MockServer

    assert REQUESTS_PER_HTTP_CLIENT == 32
    with MockServer() as server:
        client = ModelClient(
            ModelOptions(model="mock/scripted?latency_ms=1500"), base_url=server.base_url, api_key=None
        )
        messages = [[{"role": "user", "content": f"request {i}"}] for i in range(70)]
        with ThreadPoolExecutor(70) as pool:
            turns = list(pool.map(lambda m: client.complete(m, []), messages))
        assert len(turns) == 70 and all(t.message["role"] == "assistant" for t in turns)
        assert client.http.opened == 3
        assert server.stats()["peak_in_flight"] == 70  # no request waited for another's connection
        client.complete([{"role": "user", "content": "alone"}], [])
        assert client.http.opened == 3  # a later request reuses an open client


def test_http_clients_lease_the_first_client_with_room():
    opened = []
    clients = HttpClients(lambda: opened.append(object()) or opened[-1], per_client=2)
    with clients.lease() as a, clients.lease() as b, clients.lease() as c:
        assert a is b is opened[0] and c is opened[1]
    with clients.lease() as d:
        assert d is opened[0] and clients.opened == 2


def test_tool_side_model_calls_count_in_the_prompt_usage_and_take_the_run_limiter():
    # mixture_of_agents asks two reference models in parallel, then the aggregator, all at the
    # run's endpoint: 5 requests of 0.001 USD, never more than the run's limit (1) in flight
    refs = ["mock/a?latency_ms=300&cost=0.001", "mock/b?latency_ms=300&cost=0.001"]
    settings = HermesSettings(api_key=None, max_retries=0, request_timeout=30, moa_reference_models=refs)
    with MockServer() as server:
        spec = _spec(
            server, "mock/scripted?scenario=moa&cost=0.001", toolsets=("moa",), max_requests_in_flight=1
        )
        spec = spec.model_copy(update={"run_name": "aux-usage"})
        started = time.monotonic()
        outcome = run_prompt(_job("Which is larger, 2^10 or 10^3?"), spec, settings)
        elapsed = time.monotonic() - started
        stats = server.stats()
    assert outcome.row["tool_stats"]["mixture_of_agents"] == {"count": 1, "success": 1, "failure": 0}
    assert stats["requests"] == 5 and stats["peak_in_flight"] == 1
    assert elapsed >= 0.6  # the two 0.3 s reference calls waited for each other's slot
    assert outcome.usage["cost"] == pytest.approx(0.005)
    assert outcome.row["metadata"]["usage"] == outcome.usage


def test_a_spent_budget_holds_retries_not_the_first_attempts_it_admitted(mock_server):
    # the flow admits a first attempt when it submits it; a later hold (another prompt's spend
    # reached the cap) must not cut it, while a retry, which nobody admitted, is held
    prompt = "Admitted before the cap was reached: list files"
    hold_new_prompts()
    try:
        outcome = run_prompt(_job(prompt), _spec(mock_server), SETTINGS, attempt=1)
        with pytest.raises(PromptCancelled, match="budget reached"):
            run_prompt(_job(prompt + " (retry)"), _spec(mock_server), SETTINGS, attempt=2)
    finally:
        hold_new_prompts(False)
    assert outcome.row["completed"] is True and outcome.row["api_calls"] == 3
    assert _requests_for(mock_server, prompt) == 3 and _requests_for(mock_server, prompt + " (retry)") == 0


def test_a_limiter_handed_to_run_prompt_is_the_one_its_requests_take():
    # no limit in the spec (so no limiter of this process's own): the handed one bounds the
    # mixture_of_agents' parallel reference calls to 1 in flight
    from hermes_core.limiter import ConcurrencyLimiter

    refs = ["mock/a?latency_ms=300&cost=0.001", "mock/b?latency_ms=300&cost=0.001"]
    settings = HermesSettings(api_key=None, max_retries=0, request_timeout=30, moa_reference_models=refs)
    with MockServer() as server:
        spec = _spec(server, "mock/scripted?scenario=moa&cost=0.001", toolsets=("moa",))
        assert spec.max_requests_in_flight is None
        outcome = run_prompt(
            _job("Which is larger, 2^10 or 10^3?"), spec, settings, limiter=ConcurrencyLimiter(1)
        )
        stats = server.stats()
    assert outcome.row["tool_stats"]["mixture_of_agents"] == {"count": 1, "success": 1, "failure": 0}
    assert stats["requests"] == 5 and stats["peak_in_flight"] == 1
