"""The main job end to end: CLI subprocess -> Prefect flow (real server) -> agent -> HTTP -> mock model.

The mock model server runs in this test process (real uvicorn); the command line
reaches it with --base_url, so the tests count the requests each prompt made.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from prefect.client.schemas.objects import StateType

from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tests.conftest import host_pids_with, jsonl_rows, model_requests, run_args

pytestmark = pytest.mark.slow

ROW_KEYS = [
    "prompt_index",
    "conversations",
    "metadata",
    "completed",
    "partial",
    "api_calls",
    "toolsets_used",
    "tool_stats",
    "tool_error_counts",
]


def _write_dataset(path: Path, prompts: list[str | dict]) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for item in prompts:
            record = item if isinstance(item, dict) else {"prompt": item}
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def _args(dataset: Path, run: str, server, *extra: str, model: str = "mock/scripted") -> list[str]:
    return run_args(dataset, run, server, *extra, model=model)


def test_golden_run_every_output_file(cli, mock_server):
    prompts = [f"golden prompt {i}: list files" for i in range(5)]
    dataset = _write_dataset(cli.cwd / "golden.jsonl", [*prompts[:4], {"prompt": prompts[4], "topic": "x"}])
    proc = cli(*_args(dataset, "golden", mock_server, "--num_workers=3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Tool usage" in proc.stdout and "data/golden/trajectories.jsonl" in proc.stdout
    run = cli.cwd / "data" / "golden"

    # batch files: 5 prompts by 2 -> batches 0, 1, 2
    batches = {n: jsonl_rows(run / f"batch_{n}.jsonl") for n in range(3)}
    assert sorted(p.name for p in run.glob("batch_*.jsonl")) == [
        "batch_0.jsonl",
        "batch_1.jsonl",
        "batch_2.jsonl",
    ]
    assert {n: sorted(r["prompt_index"] for r in rows) for n, rows in batches.items()} == {
        0: [0, 1],
        1: [2, 3],
        2: [4],
    }
    for n, rows in batches.items():
        for row in rows:
            assert list(row) == ROW_KEYS
            assert row["metadata"]["batch_num"] == n
            assert list(row["metadata"])[:3] == ["batch_num", "timestamp", "model"]
            assert row["metadata"]["model"] == "mock/scripted"
            assert [t["from"] for t in row["conversations"]] == [
                "system",
                "human",
                "gpt",
                "tool",
                "gpt",
                "tool",
                "gpt",
            ]
            assert row["conversations"][1]["value"] == prompts[row["prompt_index"]]
            assert row["completed"] is True and row["partial"] is False and row["api_calls"] == 3
            assert row["toolsets_used"] == ["terminal", "file"]
            assert list(row["tool_stats"]) == list(ALL_POSSIBLE_TOOLS)
            assert row["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}
            assert row["tool_stats"]["write_file"] == {"count": 1, "success": 1, "failure": 0}
            assert sum(v["count"] for v in row["tool_stats"].values()) == 2
            assert row["tool_error_counts"] == dict.fromkeys(ALL_POSSIBLE_TOOLS, 0)
    assert batches[2][0]["metadata"]["source"] == {"topic": "x"}

    merged = jsonl_rows(run / "trajectories.jsonl")
    assert [r["prompt_index"] for r in merged] == [0, 1, 2, 3, 4]
    by_index = {r["prompt_index"]: r for rows in batches.values() for r in rows}
    assert merged == [by_index[i] for i in range(5)]

    checkpoint = json.loads((run / "checkpoint.json").read_text())
    assert list(checkpoint) == ["run_name", "completed_prompts", "batch_stats", "last_updated"]
    assert checkpoint["run_name"] == "golden" and checkpoint["completed_prompts"] == [0, 1, 2, 3, 4]
    assert checkpoint["batch_stats"] == {
        "0": {"processed": 2, "skipped": 0, "discarded_no_reasoning": 0},
        "1": {"processed": 2, "skipped": 0, "discarded_no_reasoning": 0},
        "2": {"processed": 1, "skipped": 0, "discarded_no_reasoning": 0},
    }

    stats = json.loads((run / "statistics.json").read_text())
    assert list(stats)[:12] == [
        "run_name", "distribution", "total_prompts", "total_batches", "batch_size", "model",
        "completed_at", "duration_seconds", "tool_statistics", "reasoning_statistics", "discarded_no_reasoning",
        "completed",
    ]  # fmt: skip
    assert (stats["run_name"], stats["distribution"], stats["model"]) == (
        "golden",
        "terminal_only",
        "mock/scripted",
    )
    assert (stats["total_prompts"], stats["total_batches"], stats["batch_size"]) == (5, 3, 2)
    assert sorted(stats["tool_statistics"]) == sorted(ALL_POSSIBLE_TOOLS)
    assert stats["tool_statistics"]["terminal"] == {
        "count": 5, "success": 5, "failure": 0, "success_rate": 100.0, "failure_rate": 0.0
    }  # fmt: skip
    assert stats["tool_statistics"]["read_file"]["count"] == 0
    assert stats["reasoning_statistics"]["total_assistant_turns"] == 15
    assert stats["reasoning_statistics"]["turns_with_reasoning"] == 15
    assert stats["reasoning_statistics"]["turns_without_reasoning"] == 0
    assert (stats["discarded_no_reasoning"], stats["failed"], stats["filtered_hallucinated"]) == (0, 0, 0)
    assert stats["completed"] == 5
    prompt_tokens = sum(r["metadata"]["usage"]["prompt_tokens"] for r in merged)
    assert stats["tokens"]["prompt"] == prompt_tokens > 0

    info = json.loads((run / "run.json").read_text())
    assert info["defining"]["model"] == "mock/scripted" and info["defining"]["max_turns"] == 10
    assert info["dataset"]["records"] == 5 and len(info["invocations"]) == 1
    assert not (run / "failures.jsonl").exists() and not (run / "discarded.jsonl").exists()
    assert [model_requests(mock_server, p) for p in prompts] == [3] * 5

    # the merged file loads with HuggingFace datasets without schema errors
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets

    loaded = datasets.load_dataset(
        "json", data_files=str(run / "trajectories.jsonl"), split="train", cache_dir=str(cli.cwd / "hf-cache")
    )
    assert loaded.num_rows == 5
    assert loaded[0]["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}

    # a second invocation without --resume is refused; with --resume it has nothing to do
    again = cli(*_args(dataset, "golden", mock_server))
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = cli(*_args(dataset, "golden", mock_server, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [model_requests(mock_server, p) for p in prompts] == [3] * 5
    assert jsonl_rows(run / "trajectories.jsonl") == merged
    # changing a defining setting is refused with the difference named
    changed = cli(*_args(dataset, "golden", mock_server, "--resume", "--max_turns=5"))
    assert changed.returncode == 2 and "max_turns: 10 -> 5" in changed.stderr


def test_kill_then_resume_loses_nothing_and_repeats_nothing(cli, mock_server):
    prompts = [f"kill test prompt {i}" for i in range(16)]
    dataset = _write_dataset(cli.cwd / "kill.jsonl", prompts)
    args = _args(dataset, "killed", mock_server, "--num_workers=2", model="mock/scripted?latency_ms=300")
    temp = cli.cwd / "temp"  # the runs' temp folder (TMPDIR): where their sandboxes' host folders are
    temp.mkdir()
    proc = cli.spawn(*args, env={"TMPDIR": str(temp)})
    run = cli.cwd / "data" / "killed"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = sum(len(p.read_bytes().splitlines()) for p in run.glob("batch_*.jsonl"))
        if rows >= 4:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {r["metadata"]["prompt_id"]: r for p in run.glob("batch_*.jsonl") for r in jsonl_rows(p)}
    assert 4 <= len(before) < 16
    requests_before = {p: model_requests(mock_server, p) for p in prompts}
    [left] = temp.glob("hermes-run-*")  # SIGKILL: the killed run's scratch folder stays, for now
    assert any(left.glob("hermes-*"))  # with the folders of its prompts in flight

    resumed = cli(*args, "--num_workers=4", "--resume", env={"TMPDIR": str(temp)})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert os.listdir(temp) == []  # the resume removed the killed run's folders, then its own
    merged = jsonl_rows(run / "trajectories.jsonl")
    assert [r["prompt_index"] for r in merged] == list(range(16))
    assert [r["conversations"][1]["value"] for r in merged] == prompts
    finished_before = {r["conversations"][1]["value"] for r in before.values()}
    for prompt in prompts:
        if prompt in finished_before:  # finished before the kill: not sent to the model again
            assert model_requests(mock_server, prompt) == requests_before[prompt] == 3
        else:
            assert model_requests(mock_server, prompt) >= 3
    for path in run.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            json.loads(line)  # no torn line anywhere


def test_reordered_and_extended_dataset_runs_only_new_prompts(cli, mock_server):
    old = [f"reorder prompt {i}" for i in range(4)]
    dataset = _write_dataset(cli.cwd / "reorder.jsonl", old)
    assert cli(*_args(dataset, "reorder", mock_server)).returncode == 0
    new = ["reorder new prompt A", "reorder new prompt B"]
    reordered = [old[3], new[0], old[1], old[0], new[1], old[2]]
    _write_dataset(dataset, reordered)
    proc = cli(*_args(dataset, "reorder", mock_server, "--resume"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [model_requests(mock_server, p) for p in old] == [3] * 4  # nothing finished ran again
    assert [model_requests(mock_server, p) for p in new] == [3, 3]
    merged = jsonl_rows(cli.cwd / "data" / "reorder" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in merged] == reordered
    assert [r["prompt_index"] for r in merged] == list(range(6))
    batch_files = sorted(p.name for p in (cli.cwd / "data" / "reorder").glob("batch_*.jsonl"))
    assert batch_files == ["batch_0.jsonl", "batch_1.jsonl", "batch_2.jsonl"]  # new rows in a new batch
    assert len(jsonl_rows(cli.cwd / "data" / "reorder" / "batch_2.jsonl")) == 2


def test_duplicate_prompts_each_get_a_row(cli, mock_server):
    dataset = _write_dataset(cli.cwd / "dups.jsonl", ["dup prompt", "dup prompt", "dup other"])
    proc = cli(*_args(dataset, "dups", mock_server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = jsonl_rows(cli.cwd / "data" / "dups" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in merged] == ["dup prompt", "dup prompt", "dup other"]
    assert len({r["metadata"]["prompt_id"] for r in merged}) == 3


def test_faults_land_in_the_right_place(cli, mock_server):
    prompts = [
        "[mock:error_5xx=50] fault: server errors after retries",
        "[mock:rate_limit=1,retry_after=0.2] fault: rate limited then fine",
        "[mock:no_reasoning] fault: no reasoning",
        "[mock:unknown_tool=1] fault: hallucinated tool",
        "[mock:loop] fault: endless loop",
        "[mock:bad_args=3,turns=4] fault: invalid arguments",
        "fault: plain prompt",
    ]
    dataset = _write_dataset(cli.cwd / "faults.jsonl", prompts)
    proc = cli(*_args(dataset, "faults", mock_server, "--max_turns=3", "--retries=0"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    run = cli.cwd / "data" / "faults"
    failures = jsonl_rows(run / "failures.jsonl")
    assert [(f["prompt_index"], f["error_type"]) for f in failures] == [(0, "ModelError")]
    assert "HTTP 500" in failures[0]["message"]
    assert [t["prompt_index"] for t in jsonl_rows(run / "discarded.jsonl")] == [2]
    merged = {r["prompt_index"]: r for r in jsonl_rows(run / "trajectories.jsonl")}
    assert sorted(merged) == [1, 4, 5, 6]  # 0 failed, 2 discarded, 3 filtered (hallucinated tool)
    assert merged[4]["completed"] is False and merged[4]["api_calls"] == 3
    assert merged[5]["partial"] is True
    assert merged[1]["completed"] is True and merged[1]["partial"] is False
    assert model_requests(mock_server, prompts[1]) == 4  # one 429, then three answered calls
    stats = json.loads((run / "statistics.json").read_text())
    assert (stats["failed"], stats["discarded_no_reasoning"], stats["filtered_hallucinated"]) == (1, 1, 1)
    assert stats["completed"] == 4
    flow_run_id = json.loads((run / "run.json").read_text())["invocations"][-1]["flow_run_id"]
    state = httpx.get(f"{cli.api_url}/flow_runs/{flow_run_id}").json()["state"]
    assert state["type"] == StateType.FAILED.value
    assert (
        state["message"].startswith("1 of 7 prompts failed")
        and "re-attempts only the failed" in state["message"]
    )


def _ancestor_named(pid: int, name: str) -> int | None:
    """The nearest process named ``name`` (``/proc/<pid>/comm``) among ``pid`` and its ancestors, or None."""
    while pid > 1:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return pid
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        pid = int(status.split("PPid:", 1)[1].split()[0])
    return None


@contextlib.contextmanager
def agent_killer(marker: str):
    """While open, a host thread SIGKILLs the sandbox agent of every command whose line holds ``marker``.

    The machine's failure (an OOM kill, a crashed agent), which no command can cause: the agent is
    its sandbox's pid-namespace init, and the kernel drops a SIGKILL to it from inside.
    """
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            for pid in host_pids_with(marker):
                agent = _ancestor_named(pid, "sandbox-agent")
                if agent is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(agent, signal.SIGKILL)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def test_failure_kinds_tell_the_provider_and_this_machine_from_the_model(cli, mock_server):
    """failures.jsonl says who failed: the provider, this machine (the sandbox died), or the model's sample."""
    prompts = [
        "[mock:error_5xx=50] kinds: server errors after retries",
        "[mock:command=sleep 31.4159] kinds: the sandbox dies",  # its agent killed from the host
        "[mock:latency_ms=3000] kinds: too slow",
        "kinds: plain prompt",
    ]
    dataset = _write_dataset(cli.cwd / "kinds.jsonl", prompts)
    args = _args(dataset, "kinds", mock_server, "--retries=1", "--prompt_timeout=2")
    with agent_killer("31.4159"):  # sleep's arguments, NUL-separated
        proc = cli(*args, env={"HERMES_LOCAL_ISOLATION": "bwrap", "HERMES_SANDBOX_AGENT": "native"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    run = cli.cwd / "data" / "kinds"
    failures = sorted(jsonl_rows(run / "failures.jsonl"), key=lambda f: f["prompt_index"])
    assert [(f["prompt_index"], f["error_type"], f["kind"], f["attempts"]) for f in failures] == [
        (0, "ModelError", "provider", 2),  # transient: retried
        (1, "SandboxError", "infra", 2),  # this machine's failure: retried like a transient one
        (2, "PromptTimeout", "model", 1),  # the sample's own: not retried (it would pay twice)
    ]
    assert list(failures[0]) == [
        "prompt_id",
        "prompt_index",
        "error_type",
        "kind",
        "message",
        "attempts",
        "usage",
        "time",
    ]
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["failed"] == 3
    assert stats["failed_by_kind"] == {"model": 1, "provider": 1, "infra": 1}
    assert [r["prompt_index"] for r in jsonl_rows(run / "trajectories.jsonl")] == [3]


def test_invalid_dataset_is_refused_before_any_model_call(cli, mock_server):
    path = cli.cwd / "bad.jsonl"
    deep = '{"prompt": "deep", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}"  # a RecursionError once
    path.write_text(
        '{"prompt": "invalid-dataset ok"}\nnot json\n\n{"no_prompt": 1}\n{"prompt": 5}\n' + deep + "\n",
        encoding="utf-8",
    )
    proc = cli(*_args(path, "bad", mock_server))
    assert proc.returncode == 2
    assert "line 2" in proc.stderr and "line 4" in proc.stderr and "line 5" in proc.stderr
    assert "line 6" in proc.stderr and "nested more than 64 levels deep" in proc.stderr
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    assert model_requests(mock_server, "invalid-dataset ok") == 0
    assert not (cli.cwd / "data" / "bad").exists()
    skipped = cli(*_args(path, "bad", mock_server, "--skip_invalid"))
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert len(jsonl_rows(cli.cwd / "data" / "bad" / "trajectories.jsonl")) == 1


def test_validation_errors_exit_non_zero_with_one_line(cli):
    proc = cli("--dataset_file=x.jsonl", "--batch_size=0", "--run_name=r")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "--batch_size" in proc.stderr
    proc = cli("--dataset_file=x.jsonl", "--batch_size=2", "--run_name=r", "--distribution=nope")
    assert proc.returncode == 2 and "invalid --distribution" in proc.stderr and "(got 'nope')" in proc.stderr
    proc = cli("--dataset_file=x.jsonl", "--batch_size=2", "--run_name=r", "--provider_sort=cheapest")
    assert proc.returncode == 2 and "--provider_sort" in proc.stderr
    listing = cli("--list_distributions")
    assert (
        listing.returncode == 0
        and "terminal_only" in listing.stdout
        and "terminal   : 100% chance" in listing.stdout
    )


def test_api_key_never_leaves_the_process(cli, mock_server):
    secret = "sk-hermes-test-SECRET-7f3a9c"
    dataset = _write_dataset(cli.cwd / "key.jsonl", ["api key prompt one", "api key prompt two"])
    proc = cli(
        *_args(dataset, "keyrun", mock_server, f"--api_key={secret}", "--providers_allowed=a,b", "--verbose")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert secret not in proc.stdout and secret not in proc.stderr
    for path in (cli.cwd / "data" / "keyrun").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    flow_run_id = json.loads((cli.cwd / "data" / "keyrun" / "run.json").read_text())["invocations"][-1][
        "flow_run_id"
    ]
    flow_run = httpx.get(f"{cli.api_url}/flow_runs/{flow_run_id}").text
    assert secret not in flow_run and '"providers_allowed":["a","b"]' in flow_run.replace(" ", "")
    logs = httpx.post(
        f"{cli.api_url}/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}}
    ).text
    assert "keyrun" in logs and secret not in logs
    artifacts = httpx.post(f"{cli.api_url}/artifacts/filter", json={}).text
    assert "keyrun" in artifacts and secret not in artifacts


def test_a_second_invocation_on_a_run_in_use_refuses(cli, mock_server):
    from hermes_core.runfolder.ledger import RunLock

    dataset = _write_dataset(cli.cwd / "lock.jsonl", ["lock prompt"])
    with RunLock(cli.cwd / "data" / "locked"):
        proc = cli(*_args(dataset, "locked", mock_server))
    assert proc.returncode == 2 and "is in use by another invocation" in proc.stderr
    assert model_requests(mock_server, "lock prompt") == 0


def test_num_workers_model_requests_are_in_flight_never_more(cli):
    from hermes_core.mockllm import MockServer

    prompts = [f"window prompt {i}" for i in range(9)]
    dataset = _write_dataset(cli.cwd / "window.jsonl", prompts)
    with MockServer() as server:  # its own counters: no other test's requests
        proc = cli(
            *_args(
                dataset, "window", server, "--num_workers=3", model="mock/scripted?latency_ms=1000&turns=0"
            )
        )
        stats = server.stats()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert stats["requests"] == 9 and stats["in_flight"] == 0
    assert stats["peak_in_flight"] == 3
    assert len(jsonl_rows(cli.cwd / "data" / "window" / "trajectories.jsonl")) == 9
