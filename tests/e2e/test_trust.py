"""Trust for real runs, end to end: no secret reaches a file, the console or the provider; SIGTERM stops cleanly.

The command line runs as a real subprocess against the session's Prefect server; the mock model
(real HTTP, in this test process) makes the agent run `env` and read its parent's environment.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import time
import zlib
from pathlib import Path

import httpx
import psutil
import pytest
from prefect.client.schemas.objects import StateType

from hermes_core.mockllm import MockServer
from tests.conftest import conversation_key, jsonl_rows, run_args, write_prompts

pytestmark = pytest.mark.slow

MODEL_KEY = "sk-or-v1-trust-test-0d5f1e2a9b7c"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYtrust-test"


def _all_bytes(folder: Path) -> list[tuple[Path, bytes]]:
    """Every file of a run folder; task-cache records are decoded (base64 + zlib) so their rows are searched too."""
    found = []
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        found.append((path, data))
        try:
            record = json.loads(data)
            found.append((path, zlib.decompress(base64.b64decode(record["result"]))))
        except (ValueError, KeyError, TypeError, zlib.error):
            pass
    return found


@pytest.mark.parametrize("key_from", ["environment", "flag"])
def test_no_secret_reaches_a_file_the_console_or_the_provider(cli, tmp_path, key_from):
    prompts = [
        "[mock:command=env] show the environment",
        "[mock:command=cat /proc/$PPID/environ] show the parent's environment",
        # the grandparent of a plain local command is this run's Python process, with the keys
        "[mock:command=cat /proc/$(awk '{print $4}' /proc/$PPID/stat)/environ] show the run's environment",
    ]
    dataset = write_prompts(cli.cwd / "secrets.jsonl", prompts)
    log = tmp_path / "requests.jsonl"
    env = {
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "HERMES_LOCAL_ISOLATION": "none",
    }  # plain: the weakest sandbox
    extra = []
    if key_from == "environment":
        env["OPENROUTER_API_KEY"] = MODEL_KEY
    else:
        extra.append(f"--api_key={MODEL_KEY}")
    with MockServer(request_log=str(log), log_bodies=True) as server:
        proc = cli(*run_args(dataset, f"secrets-{key_from}", server, "--verbose", *extra), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / f"secrets-{key_from}"
    rows = {r["conversations"][1]["value"]: r for r in jsonl_rows(run / "trajectories.jsonl")}
    env_output, parent_output, run_output = (rows[p]["conversations"][3]["value"] for p in prompts)
    assert "PATH=" in env_output and "PATH=" in parent_output  # the commands really ran
    assert "[REDACTED]" not in env_output + parent_output  # allow-listed environments: nothing to cut
    assert "PREFECT_API_URL=" in run_output and "[REDACTED]" in run_output  # the keys there were cut out

    secrets = [MODEL_KEY.encode(), AWS_SECRET.encode()]
    for path, data in _all_bytes(run):
        assert not any(s in data for s in secrets), path
    assert not any(s.decode() in proc.stdout + proc.stderr for s in secrets)
    bodies = log.read_bytes()
    assert bodies.count(b'"body"') >= 9 and conversation_key(prompts[2]).encode() in bodies
    assert not any(s in bodies for s in secrets)  # nothing secret was sent to the provider


def _flow_run_records(api_url: str, flow_run_id: str) -> str:
    """Everything the Prefect server holds about a flow run, as text: its state, task runs, logs, events.

    Polls until the failed prompt's task-run state and the flow run's final state are in (the server
    ingests logs and events in the background).
    """
    deadline = time.monotonic() + 60
    while True:
        flow = httpx.get(f"{api_url}/flow_runs/{flow_run_id}").json()
        tasks = httpx.post(
            f"{api_url}/task_runs/filter", json={"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200}
        ).json()
        logs = httpx.post(
            f"{api_url}/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}
        ).json()
        events = httpx.post(
            f"{api_url}/events/filter",
            json={"filter": {"related": {"resources_in_roles": [[f"prefect.flow-run.{flow_run_id}", "flow-run"]]}},
                  "limit": 200},
        ).json()  # fmt: skip
        text = json.dumps([flow, tasks, logs, events])
        failed = [t for t in tasks if t["state"] and t["state"]["type"] == StateType.FAILED.value]
        if (failed and flow["state"]["type"] == StateType.FAILED.value and "prompt 0 failed" in text) or (
            time.monotonic() > deadline
        ):
            return text
        time.sleep(0.5)


def test_a_provider_error_that_echoes_the_key_leaks_it_nowhere(cli, tmp_path):
    """401 quoting the Authorization header: the console, the run folder and Prefect's database get [REDACTED]."""
    dataset = write_prompts(cli.cwd / "echo.jsonl", ["echo auth prompt"])
    with MockServer() as server:
        args = run_args(dataset, "echo-auth", server, model="mock/scripted?echo_auth=true")
        proc = cli(*args, env={"OPENROUTER_API_KEY": MODEL_KEY})
    assert proc.returncode == 1, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert "Incorrect API key provided: Bearer [REDACTED]" in console and MODEL_KEY not in console
    run = cli.cwd / "data" / "echo-auth"
    failure = jsonl_rows(run / "failures.jsonl")[0]
    assert failure["error_type"] == "ModelError" and "[REDACTED]" in failure["message"]
    for path, data in _all_bytes(run):
        assert MODEL_KEY.encode() not in data, path  # .prefect-results included (the stored exception)
    flow_run_id = json.loads((run / "run.json").read_text())["invocations"][-1]["flow_run_id"]
    records = _flow_run_records(cli.api_url, flow_run_id)
    assert "Bearer [REDACTED]" in records  # the error reached the server: state messages, logs
    assert MODEL_KEY not in records


def test_the_models_own_text_is_redacted_in_every_row(cli, tmp_path):
    """A model that writes a leaked key in its answer (decoded by itself): rows, cache and export hold [REDACTED]."""
    dataset = write_prompts(
        cli.cwd / "answer.jsonl", [f"[mock:turns=0,answer=the key is {MODEL_KEY} ok] answer"]
    )
    with MockServer() as server:
        proc = cli(*run_args(dataset, "model-text", server), env={"OPENROUTER_API_KEY": MODEL_KEY})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "model-text"
    row = jsonl_rows(run / "trajectories.jsonl")[0]
    assert row["conversations"][-1]["value"].endswith("the key is [REDACTED] ok")
    exported = cli("export", str(run), "--out", str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr[-3000:]
    for path, data in [*_all_bytes(run), *_all_bytes(tmp_path / "hf")]:
        assert MODEL_KEY.encode() not in data, path


def _holders(hold: Path) -> list[psutil.Process]:
    """Live processes (in sandboxes too) whose command line waits on the ``hold`` file."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.info["cmdline"] and any(hold.name in part for part in proc.info["cmdline"]):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        except psutil.Error:
            continue
    return found


def test_sigterm_stops_the_run_cleanly_and_resume_completes_it(cli, mock_server, tmp_path):
    work = tmp_path / "work"  # the records' cwd: bound writable into each prompt's sandbox
    work.mkdir()
    hold = work / f"hold-{os.getpid()}-{time.monotonic_ns()}"
    hold.write_text("x")
    quick = ["sigterm quick prompt 0", "sigterm quick prompt 1"]
    held = [
        f"[mock:command=while test -f {hold.name}; do sleep 0.2; done] sigterm held {i}" for i in range(4)
    ]
    dataset = write_prompts(cli.cwd / "sigterm.jsonl", quick + held, cwd=str(work))
    args = run_args(dataset, "sigterm", mock_server, "--num_workers=4")
    proc = cli.spawn(*args)
    run = cli.cwd / "data" / "sigterm"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (len(_holders(hold)) < 4 or not (run / "batch_0.jsonl").exists()):
        assert proc.poll() is None, "the run ended early"
        time.sleep(0.2)
    assert len(_holders(hold)) >= 4, "the held prompts' commands never started"
    rows_before = jsonl_rows(run / "batch_0.jsonl")

    started = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # the command line's own process only, as `kill` or a supervisor does
    proc.wait(timeout=60)
    stopped_in = time.monotonic() - started
    assert proc.returncode == 130 and stopped_in < 15, (proc.returncode, stopped_in)
    time.sleep(0.5)
    assert _holders(hold) == []
    info = json.loads((run / "run.json").read_text())
    flow_run_id = info["invocations"][-1]["flow_run_id"]
    state = httpx.get(f"{cli.api_url}/flow_runs/{flow_run_id}").json()["state"]
    assert state["type"] == StateType.CANCELLED.value and "SIGTERM" in state["message"], state
    assert jsonl_rows(run / "batch_0.jsonl") == rows_before  # finished rows intact
    assert not (run / "failures.jsonl").exists()  # cancelled prompts are not failures

    hold.unlink()
    resumed = cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    merged = jsonl_rows(run / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in merged] == quick + held
    assert len({r["metadata"]["prompt_id"] for r in merged}) == 6
    requests = mock_server.stats()["by_conversation"]
    assert [requests[conversation_key(p)] for p in quick] == [3, 3]  # not paid for again


def test_failures_record_the_attempts_that_really_ran(cli, mock_server):
    prompts = [
        "[mock:no_such_option=1] attempts: a 400 is not retried",
        "[mock:error_5xx=50] attempts: a 5xx is retried",
        "[mock:hang_s=30] attempts: a prompt timeout is not retried",
    ]
    dataset = write_prompts(cli.cwd / "attempts.jsonl", prompts)
    proc = cli(*run_args(dataset, "attempts", mock_server, "--retries=2", "--prompt_timeout=2"),
               env={"HERMES_MAX_RETRIES": "0"})  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    failures = {f["prompt_index"]: f for f in jsonl_rows(cli.cwd / "data" / "attempts" / "failures.jsonl")}
    assert {i: (f["error_type"], f["attempts"]) for i, f in failures.items()} == {
        0: ("ModelError", 1),
        1: ("ModelError", 3),
        2: ("PromptTimeout", 1),
    }
    requests = mock_server.stats()["by_conversation"]
    assert [requests[conversation_key(p)] for p in prompts] == [1, 3, 1]

    hanging = write_prompts(
        cli.cwd / "hanging.jsonl", ["[mock:hang_s=30,hang_count=5] attempts: timeout retried"]
    )
    again = cli(*run_args(hanging, "attempts-retried", mock_server, "--retries=1", "--prompt_timeout=2",
                          "--retry_timeouts"), env={"HERMES_MAX_RETRIES": "0"})  # fmt: skip
    assert again.returncode == 1
    failures = {
        f["prompt_index"]: f for f in jsonl_rows(cli.cwd / "data" / "attempts-retried" / "failures.jsonl")
    }
    assert failures[0]["attempts"] == 2  # asked for: the timed-out prompt was tried again


def test_overwrite_never_gets_an_old_cached_result(cli, mock_server, tmp_path):
    prompts = ["overwrite cache prompt 0", "overwrite cache prompt 1"]
    dataset = write_prompts(cli.cwd / "overwrite.jsonl", prompts)
    shared_cache = tmp_path / "shared-cache"  # outside the run folder: --overwrite does not delete it
    args = run_args(dataset, "overwritten", mock_server, f"--result_storage={shared_cache}")
    assert cli(*args).returncode == 0
    assert any(shared_cache.iterdir())
    before = [mock_server.stats()["by_conversation"][conversation_key(p)] for p in prompts]
    assert cli(*args, "--overwrite").returncode == 0
    after = [mock_server.stats()["by_conversation"][conversation_key(p)] for p in prompts]
    assert [a - b for a, b in zip(after, before, strict=True)] == [
        3,
        3,
    ]  # ran again, not served from the cache


@pytest.mark.parametrize("same_flow_run", [True, False])
def test_the_summary_is_only_this_flow_runs(tmp_path, capsys, same_flow_run):
    import uuid

    from prefect.states import Completed, Crashed

    from flows.config import BatchConfig
    from flows.console import print_summary

    config = BatchConfig.from_options(
        dataset_file="d.jsonl", batch_size=1, run_name="r", output_dir=str(tmp_path)
    )
    this_run = uuid.uuid4()
    stats = {
        "tool_statistics": {}, "reasoning_statistics": {"turns_with_reasoning": 1, "total_assistant_turns": 1,
        "coverage_percent": 100.0}, "total_prompts": 7, "completed": 7, "discarded_no_reasoning": 0,
        "filtered_hallucinated": 0, "failed": 0, "tokens": {"total": 1}, "cost_usd": None, "duration_seconds": 1,
        "flow_run_id": str(this_run if same_flow_run else uuid.uuid4()),
    }  # fmt: skip
    config.run_dir.mkdir(parents=True)
    (config.run_dir / "statistics.json").write_text(json.dumps(stats))
    state = (Completed if same_flow_run else Crashed)(message="engine crashed")
    state.state_details.flow_run_id = this_run
    print_summary(config, state)
    out = capsys.readouterr().out
    if same_flow_run:
        assert "Prompts: 7 · trajectories: 7" in out
    else:
        assert (
            "Prompts: 7" not in out
            and "ended before writing its statistics" in out
            and "engine crashed" in out
        )


def test_a_lone_surrogate_in_a_reply_or_a_prompt_is_replaced_and_the_run_resumes(cli, tmp_path):
    """A reply carrying ``\\ud83d`` (half an emoji, as JSON can carry it) and a prompt carrying
    ``\\ud800`` used to crash the ledger write, and every resume after it: each is U+FFFD now."""
    dataset = cli.cwd / "surrogates.jsonl"
    dataset.write_text(
        '{"prompt": "plain prompt"}\n{"prompt": "broken \\ud800 prompt"}\n{"prompt": "third prompt"}\n',
        encoding="utf-8",
    )
    with MockServer() as server:
        args = run_args(dataset, "surrogates", server, model="mock/scripted?turns=0&lone_surrogate=true")
        proc = cli(*args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        run = cli.cwd / "data" / "surrogates"
        rows = jsonl_rows(run / "trajectories.jsonl")
        assert [r["conversations"][1]["value"] for r in rows] == [
            "plain prompt",
            "broken \ufffd prompt",
            "third prompt",
        ]
        assert all(r["conversations"][-1]["value"].endswith("\ufffd") for r in rows)
        for path, data in _all_bytes(run):
            assert data.decode("utf-8", errors="replace").encode() == data, path  # valid UTF-8
        requests = server.stats()["requests"]
        resumed = cli(*args, "--resume")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert jsonl_rows(run / "trajectories.jsonl") == rows and server.stats()["requests"] == requests


def test_the_ephemeral_system_prompt_is_sent_but_kept_out_of_the_run_folder_and_exports(cli, tmp_path):
    """run.json keeps its sha256 (a resume must bring the same one); no file of the run or its export
    holds its text; another prompt on resume is refused before any request."""
    system = "EPHEMERAL-persona-4417: answer as a pirate"
    dataset = write_prompts(cli.cwd / "ephemeral.jsonl", ["ephemeral prompt 0", "ephemeral prompt 1"])
    log = tmp_path / "requests.jsonl"
    with MockServer(request_log=str(log), log_bodies=True) as server:
        args = run_args(dataset, "ephemeral", server, f"--ephemeral_system_prompt={system}")
        proc = cli(*args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert system in log.read_text(encoding="utf-8")  # it was sent with the calls
        run = cli.cwd / "data" / "ephemeral"
        stored = json.loads((run / "run.json").read_text())["defining"]["ephemeral_system_prompt"]
        assert stored["sha256"] == hashlib.sha256(json.dumps(system).encode()).hexdigest()
        exported = cli("export", str(run), "--out", str(tmp_path / "hf"))
        assert exported.returncode == 0, exported.stderr[-3000:]
        for path, data in [*_all_bytes(run), *_all_bytes(tmp_path / "hf")]:
            assert b"EPHEMERAL-persona" not in data, path
        requests = server.stats()["requests"]
        assert cli(*args, "--resume").returncode == 0  # the same prompt: the run continues
        changed = cli(*run_args(dataset, "ephemeral", server, "--ephemeral_system_prompt=other", "--resume"))
        assert changed.returncode == 2 and "ephemeral_system_prompt" in changed.stderr, changed.stderr[-2000:]
        assert "EPHEMERAL-persona" not in changed.stderr  # the message shows digests, not the text
        assert server.stats()["requests"] == requests
