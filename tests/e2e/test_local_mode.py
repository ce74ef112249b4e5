"""The README's main command, exactly as a newcomer runs it: no key, no server (Prefect's local API)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_readme_main_command_on_the_example_dataset(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "OPENROUTER_", "OPENAI_"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "batch_runner.py"),
            f"--dataset_file={REPO / 'examples' / 'prompts.jsonl'}",
            "--batch_size=5",
            "--run_name=demo",
            "--model=mock/scripted",
            "--distribution=terminal_only",
            "--num_workers=4",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting a local Prefect API" in proc.stderr
    run = tmp_path / "data" / "demo"
    rows = [
        json.loads(line) for line in (run / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    dataset = (REPO / "examples" / "prompts.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(rows) == len(dataset) == 24
    assert [r["conversations"][1]["value"] for r in rows] == [json.loads(line)["prompt"] for line in dataset]
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["completed"] == 24 and stats["failed"] == 0
    assert stats["tool_statistics"]["terminal"]["count"] == 24
    # the first tool turn of the first prompt holds the real output of a real shell command
    assert '"exit_code": 0' in rows[0]["conversations"][3]["value"]


def test_ctrl_c_stops_at_once_and_leaves_nothing_running(tmp_path):
    import signal
    import time

    import psutil

    marker = "hermes-ctrl-c-test-sleeper"
    dataset = tmp_path / "slow.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"prompt": f"[mock:command=exec -a {marker} sleep 120] slow {i}"}) + "\n"
            for i in range(4)
        ),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "OPENROUTER_", "OPENAI_"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=2",
         "--run_name=slow", "--model=mock/scripted", "--distribution=terminal_only"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip

    def sleepers() -> list[psutil.Process]:
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and marker in p.info["cmdline"][0]
        ]

    deadline = time.monotonic() + 120
    while len(sleepers()) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert len(sleepers()) >= 2, "the prompts' commands never started"
    children = psutil.Process(proc.pid).children(recursive=True)

    def command_line(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # exited meanwhile
            return ""

    servers = [c for c in children if "uvicorn" in command_line(c)]
    assert len(servers) == 1, [command_line(c) for c in children]
    # the local API writes task-run events in batches (flows/tuning.py), Prefect's default is 1
    assert servers[0].environ()["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"] == "500"
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - started < 10
    assert "stopped (SIGINT)" in stderr and "--resume to continue" in stderr
    time.sleep(0.5)
    assert sleepers() == []
    assert [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE] == []
