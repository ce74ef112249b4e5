"""Scale-out: the same flow with prompt tasks on a local multi-process Dask cluster (prefect-dask)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tool_outputs

pytestmark = pytest.mark.slow


def _comparable(row: dict) -> dict:
    """What must not depend on the task runner (tool outputs hold temp paths and times)."""
    return {
        "prompt_index": row["prompt_index"],
        "turns": [(t["from"], t["value"]) for t in row["conversations"] if t["from"] != "tool"],
        "tool_turns": sum(t["from"] == "tool" for t in row["conversations"]),
        "completed": row["completed"],
        "partial": row["partial"],
        "api_calls": row["api_calls"],
        "toolsets_used": row["toolsets_used"],
        "tool_stats": row["tool_stats"],
        "tool_error_counts": row["tool_error_counts"],
        "usage": row["metadata"]["usage"],
    }


def test_dask_runner_produces_the_same_trajectories_as_threads(cli, mock_server):
    prompts = [f"dask comparison prompt {i}" for i in range(6)]
    dataset = cli.cwd / "dask.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    common = [f"--dataset_file={dataset}", "--batch_size=4", "--model=mock/scripted?seed=5",
              "--base_url", mock_server.base_url, "--distribution=balanced", "--num_workers=4"]  # fmt: skip
    threads = cli(*common, "--run_name=threads")
    assert threads.returncode == 0, threads.stderr[-3000:]
    dask = cli(*common, "--run_name=dask", "--task_runner=dask", "--dask_workers=2", timeout=400)
    assert dask.returncode == 0, dask.stderr[-3000:]

    def rows(run: str) -> list[dict]:
        text = (cli.cwd / "data" / run / "trajectories.jsonl").read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines()]

    assert [_comparable(r) for r in rows("dask")] == [_comparable(r) for r in rows("threads")]
    assert len(rows("dask")) == 6


def test_dask_prompts_run_in_the_worker_processes(cli, mock_server):
    # a plain local command's grandparent is the Python process that runs the prompt
    show = "awk '{print $4}' /proc/$PPID/stat"
    prompts = [f"[mock:turns=1,command={show}] dask pid prompt {i}" for i in range(4)]
    dataset = cli.cwd / "pids.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    proc = cli.spawn(
        f"--dataset_file={dataset}", "--batch_size=4", "--model=mock/scripted", "--base_url", mock_server.base_url,
        "--distribution=terminal_only", "--num_workers=4", "--run_name=dask-pids", "--task_runner=dask",
        "--dask_workers=2", env={"HERMES_LOCAL_ISOLATION": "none"},
    )  # fmt: skip
    assert proc.wait(timeout=400) == 0
    rows = [json.loads(line) for line in (cli.cwd / "data" / "dask-pids" / "trajectories.jsonl").open()]
    pids = set()
    for row in rows:
        pids.add(int(tool_outputs(row)[0]))
    assert len(rows) == 4 and proc.pid not in pids  # not the flow's process
    assert 1 <= len(pids) <= 2  # the local cluster's worker processes


def _worker_profiler_settings(monkeypatch, env: dict[str, str]) -> list:
    """``distributed.worker.profile.enabled`` as seen in each worker of the flow's local cluster."""
    import dask

    from flows.config import BatchConfig
    from flows.dispatch import prompt_task_runner
    from flows.tuning import local_dask_cluster_settings

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = BatchConfig.from_options(
        dataset_file="d.jsonl", batch_size=1, run_name="r", task_runner="dask", dask_workers=2, num_workers=2
    )
    runner = prompt_task_runner(config)
    with local_dask_cluster_settings(), runner:
        seen = runner.client.run(lambda: dask.config.get("distributed.worker.profile.enabled"))
    assert dask.config.get("distributed.worker.profile.enabled") is True  # the flow process's own is restored
    return sorted(seen.values())


def test_local_cluster_workers_run_without_the_dask_profiler(monkeypatch):
    # the profiler's sys._current_frames() can deadlock Python 3.11 (flows/tuning.py)
    monkeypatch.delenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", raising=False)
    assert _worker_profiler_settings(monkeypatch, {}) == [False, False]


def test_a_dask_profiler_setting_in_the_environment_wins(monkeypatch):
    seen = _worker_profiler_settings(monkeypatch, {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "True"})
    assert seen == [True, True]
