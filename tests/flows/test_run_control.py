"""Run control end to end (README § Run control): spend cap, adaptive concurrency, pilot.

CLI subprocess -> Prefect flow (real server) -> agent -> real HTTP -> a mock model server of
this test process (its own counters and request log per test).
"""

from __future__ import annotations

import json
import random
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from prefect.client.schemas.objects import StateType

from flows.budget import BUDGET_REACHED
from hermes_core.mockllm import MockServer
from tests.conftest import conversation_key, host_pids_with, jsonl_rows, run_args, write_prompts

pytestmark = pytest.mark.slow


def _state(cli, run: Path) -> dict:
    flow_run_id = json.loads((run / "run.json").read_text())["invocations"][-1]["flow_run_id"]
    return httpx.get(f"{cli.api_url}/flow_runs/{flow_run_id}").json()["state"]


@pytest.fixture
def server(tmp_path):
    log = tmp_path / "requests.jsonl"
    with MockServer(request_log=str(log)) as srv:
        srv.log = log
        yield srv


def test_a_cost_cap_without_a_cost_source_is_refused_before_any_request(cli, server):
    dataset = write_prompts(cli.cwd / "nocost.jsonl", ["no cost source 0"])
    proc = cli(*run_args(dataset, "nocost", server, "--max_cost_usd=1"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "max_cost_usd" in errors[0] and "price_per_mtok_in" in errors[0], proc.stderr
    assert server.stats()["requests"] == 0
    # a price is a cost source; so is a mock model id that reports cost (refused only without both)
    priced = cli(*run_args(dataset, "nocost", server, "--max_cost_usd=1", "--price_per_mtok_in=3"))
    assert priced.returncode == 0, priced.stderr[-2000:]


def test_an_api_key_secret_that_does_not_load_fails_the_run_before_any_request(cli, server):
    dataset = write_prompts(cli.cwd / "nosecret.jsonl", ["secret block 0", "secret block 1"])
    proc = cli(*run_args(dataset, "nosecret", server, "--api_key_secret=no-such-block"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (
        "api_key_secret: the Prefect Secret block 'no-such-block' cannot be loaded"
        in proc.stdout + proc.stderr
    )
    assert server.stats()["requests"] == 0
    run = cli.cwd / "data" / "nosecret"
    assert run.is_dir() and not list(run.glob("batch_*.jsonl"))  # the run began, no prompt ran


def test_the_cap_stops_the_run_and_a_higher_cap_resumes_without_paying_again(cli, server):
    prompts = [f"capped prompt {i}: list files" for i in range(12)]
    dataset = write_prompts(cli.cwd / "capped.jsonl", prompts)
    model = "mock/scripted?cost=0.001"  # 3 requests per prompt: $0.003 a prompt
    args = run_args(dataset, "capped", server, "--num_workers=2", model=model)
    proc = cli(*args, "--max_cost_usd=0.01")
    assert proc.returncode == 3, proc.stderr[-3000:]
    run = cli.cwd / "data" / "capped"
    state = _state(cli, run)
    assert state["type"] == StateType.FAILED.value and state["name"] == BUDGET_REACHED, state
    rows = jsonl_rows(run / "trajectories.jsonl")  # every output is written
    done = len(rows)
    assert 3 <= done < 12
    message = state["message"]
    assert f"{done} of 12 prompts done, $" in message and "of $0.01 cap" in message, message
    assert message.endswith("raise the cap and resume to continue"), message
    stats = json.loads((run / "statistics.json").read_text())
    spent = stats["budget"]["cost_usd"]
    assert spent == pytest.approx(0.003 * done)
    assert spent <= 0.01 + 2 * 0.003 + 1e-9  # within the cap plus what the 2 prompts in flight spent
    assert "raise the cap and resume" in proc.stdout + proc.stderr
    assert "of cap $0.01 (projected " in proc.stderr  # the live line: spend, cap, projection for the dataset

    resumed = cli(*args, "--max_cost_usd=1", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    merged = jsonl_rows(run / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in merged] == prompts
    by_conversation = server.stats()["by_conversation"]
    assert [by_conversation[conversation_key(p)] for p in prompts] == [3] * 12  # no prompt sent twice
    final = json.loads((run / "statistics.json").read_text())
    assert final["budget"]["cost_usd"] == pytest.approx(0.036)  # the whole run, both invocations
    assert json.loads((run / "spend.json").read_text())["version"] == 1


def test_on_budget_cancel_cancels_running_prompts_and_leaves_no_command(cli, server):
    marker = f"97.{time.monotonic_ns() % 10**6}"
    slow = [f"[mock:command=sh -c 'exec sleep {marker}'] capped slow {i}" for i in range(2)]
    fast = [f"capped fast prompt {i}: list files" for i in range(3)]  # 3 requests each
    dataset = write_prompts(cli.cwd / "cancel.jsonl", [fast[0], *slow, fast[1], fast[2]])
    model = "mock/scripted?cost=0.01"
    args = run_args(dataset, "capcancel", server, "--num_workers=3", "--on_budget=cancel", model=model)
    started = time.monotonic()
    # slow start: prompt 0 alone ($0.03); then 1 and 2 are admitted while the spend is $0.03 (0.03 x 3
    # <= 0.12). Prompt 3 is admitted when the spend is still $0.03 (0.03 x 4 <= 0.12), that is before
    # the first answer of 1 or 2 is counted; then, when 3 ends, the mean is $0.04 and a 4th would
    # pass the cap. A loaded machine does not always give that order: when prompt 1's first answer
    # is counted before prompt 2 is considered ($0.04 x 3 > 0.12), prompt 2 never starts either.
    # Every way, the cap is reached with the started slow prompts asleep: they are cancelled, and
    # prompt 4 never starts.
    proc = cli(*args, "--max_cost_usd=0.12")
    took = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert took < 80  # the sleeps (97 s) were cut short
    deadline = time.monotonic() + 5
    while host_pids_with(f"sleep\0{marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_pids_with(f"sleep\0{marker}") == []
    run = cli.cwd / "data" / "capcancel"
    assert _state(cli, run)["name"] == BUDGET_REACHED
    done = [r["prompt_index"] for r in jsonl_rows(run / "trajectories.jsonl")]
    assert done in ([0, 3], [0])  # prompt 3 ran to its end, or never started
    assert not (run / "failures.jsonl").exists()  # cancelled prompts are not failures
    cancelled = sorted(c["prompt_index"] for c in jsonl_rows(run / "cancelled.jsonl"))  # their spend counts
    assert cancelled in ([1, 2], [1])  # prompt 2 was cancelled, or never started
    by_conversation = server.stats()["by_conversation"]
    assert conversation_key(fast[2]) not in by_conversation  # never started
    assert by_conversation.get(conversation_key(fast[1]), 0) == (3 if 3 in done else 0)
    answered = [by_conversation.get(conversation_key(p), 0) for p in slow]  # one answer, then the sleep
    assert answered == ([1, 1] if cancelled == [1, 2] else [1, 0])
    assert cancelled == [1, 2] or done == [0]  # prompt 2 never started: neither did prompt 3
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["budget"]["cost_usd"] == pytest.approx(0.03 * len(done) + 0.01 * sum(answered))


@pytest.mark.parametrize("on_budget", ["cancel", "drain"])
def test_a_cap_smaller_than_one_prompt_costs_at_most_one_request_or_one_prompt(cli, server, on_budget):
    """$1 a reply, a $0.50 cap, 8 workers: before any spend is known only one prompt runs, and
    each request checks the cap: ``cancel`` sends no request past it, ``drain`` finishes that one
    prompt (3 requests). Without the slow start the 8 prompts ran at once: $24, 48 times the cap."""
    prompts = [f"costly prompt {i}: list files" for i in range(8)]
    dataset = write_prompts(cli.cwd / f"costly-{on_budget}.jsonl", prompts)
    model = "mock/scripted?cost=1"
    extra = ("--num_workers=8", f"--on_budget={on_budget}")
    proc = cli(*run_args(dataset, f"costly-{on_budget}", server, *extra, model=model), "--max_cost_usd=0.5")
    assert proc.returncode == 3, proc.stderr[-3000:]
    run = cli.cwd / "data" / f"costly-{on_budget}"
    answered = [line for line in jsonl_rows(server.log) if line["status"] == 200]
    stats = json.loads((run / "statistics.json").read_text())
    rows = jsonl_rows(run / "trajectories.jsonl") if (run / "trajectories.jsonl").exists() else []
    if on_budget == "cancel":
        assert len(answered) == 1 and stats["budget"]["cost_usd"] == pytest.approx(1.0)
        assert rows == [] and [c["prompt_index"] for c in jsonl_rows(run / "cancelled.jsonl")] == [0]
    else:
        assert len(answered) == 3 and stats["budget"]["cost_usd"] == pytest.approx(3.0)
        assert [r["prompt_index"] for r in rows] == [0]
    assert stats["budget"]["overshoot_usd"] == pytest.approx(stats["budget"]["cost_usd"] - 0.5)
    assert {conversation_key(p) for p in prompts[1:]}.isdisjoint(server.stats()["by_conversation"])


def test_adaptive_concurrency_keeps_under_a_providers_limit(cli, server):
    prompts = [f"rate limited prompt {i}: list files" for i in range(48)]
    dataset = write_prompts(cli.cwd / "limited.jsonl", prompts)
    model = "mock/scripted?max_in_flight=4&latency_ms=400&retry_after=1"
    args = run_args(dataset, "limited", server, "--num_workers=16", "--batch_size=8", model=model)
    proc = cli(*args, env={"HERMES_MAX_RETRIES": "5"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "limited"
    assert len(jsonl_rows(run / "trajectories.jsonl")) == 48  # every prompt completes
    log = jsonl_rows(server.log)
    served = [line for line in log if line["status"] == 200]
    refused = [line for line in log if line["status"] == 429]
    assert len(served) == 48 * 3
    assert len(refused) <= len(served) / 4, (len(refused), len(served))
    times = sorted(datetime.fromisoformat(line["time"]).timestamp() for line in log)
    throughput = len(served) / (times[-1] - times[0])
    assert throughput >= 0.7 * 4 / 0.4, throughput  # 4 in flight at 400 ms: 10 requests/s
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["concurrency"]["rate_limited"] == len(refused)
    assert 1 <= stats["concurrency"]["lowest_limit"] <= 8 and stats["concurrency"]["max_limit"] == 16
    assert f"limit {stats['concurrency']['limit']} · 429s {len(refused)}" in proc.stderr  # the console's line
    artifacts = httpx.post(
        f"{cli.api_url}/artifacts/filter", json={"artifacts": {"key": {"any_": ["limited-progress"]}}}
    ).json()
    assert artifacts and "limit " in artifacts[0]["description"] and "429s" in artifacts[0]["description"]
    assert artifacts[0]["data"] == 100 and artifacts[0]["description"].startswith(
        "48/48 prompts"
    )  # the final update
    print(f"\nadaptive: {len(refused)} x 429 for {len(served)} served, {throughput:.2f} requests/s")


def test_pilot_projects_the_run_and_resume_does_not_pay_for_it_again(cli, server):
    prompts = [f"pilot prompt {i}: list files" for i in range(10)]
    dataset = write_prompts(cli.cwd / "pilot.jsonl", prompts)
    args = run_args(dataset, "pilot", server, "--num_workers=2", "--seed=3", model="mock/scripted?cost=0.001")
    proc = cli(*args, "--pilot=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "pilot"
    report = json.loads((run / "pilot.json").read_text())
    drawn = sorted(random.Random(3).sample(range(10), 4))
    assert sorted(r["prompt_index"] for r in jsonl_rows(run / "trajectories.jsonl")) == drawn
    assert report["prompts_run"] == 4 and report["total_prompts"] == 10
    assert report["cost_per_prompt"]["mean"] == pytest.approx(0.003)
    assert report["projection"]["cost_usd"] == pytest.approx(0.03)
    per_prompt = report["tokens_per_prompt"]["mean"]
    assert per_prompt > 0 and report["projection"]["tokens"] == round(per_prompt * 10)
    assert report["failure_rate"] == 0 and report["discard_rate"] == 0
    assert report["tool_calls_per_prompt"]["terminal"] >= 1
    assert report["projection"]["wall_time_s"] > 0
    assert "pilot: 4 prompts run" in proc.stdout and "projected for 10 prompts" in proc.stdout

    full = cli(*args, "--resume")
    assert full.returncode == 0, full.stderr[-3000:]
    by_conversation = server.stats()["by_conversation"]
    assert [by_conversation[conversation_key(p)] for p in prompts] == [3] * 10  # pilot prompts not re-sent
    assert len(jsonl_rows(run / "trajectories.jsonl")) == 10


def test_a_failed_prompt_records_what_it_spent_and_the_cap_counts_it(cli, server):
    dataset = write_prompts(cli.cwd / "spentfail.jsonl", ["spent then failed: list files"])
    model = "mock/scripted?cost=0.001&latency_ms=800&turns=5"  # two calls answered, then the deadline
    args = run_args(dataset, "spentfail", server, "--retries=0", "--prompt_timeout=2", model=model)
    proc = cli(*args, "--max_total_tokens=1000000", env={"HERMES_MAX_RETRIES": "0"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    run = cli.cwd / "data" / "spentfail"
    [failure] = jsonl_rows(run / "failures.jsonl")
    answered = sum(1 for line in jsonl_rows(server.log) if line["status"] == 200)
    assert failure["error_type"] == "PromptTimeout" and answered >= 1
    # what the client received: an answer that came after the deadline abandoned it is unseen
    received = round(failure["usage"]["cost"] / 0.001)
    assert answered - 1 <= received <= answered and received >= 1 and failure["usage"]["prompt_tokens"] > 0
    stats = json.loads((run / "statistics.json").read_text())
    tokens = failure["usage"]["prompt_tokens"] + failure["usage"]["completion_tokens"]
    assert stats["budget"]["tokens"] == tokens
    assert stats["budget"]["cost_usd"] == pytest.approx(0.001 * received)


def test_run_control_options_are_flow_parameters():
    from flows.generate import generate_trajectories

    properties = generate_trajectories.parameters.properties
    for name in ("max_cost_usd", "max_total_tokens", "price_per_mtok_in", "price_per_mtok_out", "on_budget",
                 "adaptive_concurrency", "pilot"):  # fmt: skip
        assert name in properties and properties[name].get("description"), name
    assert (
        properties["on_budget"]["default"] == "drain"
        and properties["adaptive_concurrency"]["default"] is True
    )
