"""Deployments for real: prefect server (SQLite and PostgreSQL), process work pool, worker, prefect.yaml.

Each stack (database, server with its UI, deployment, worker: :mod:`tests.prefect_stack`) is
started by the session's ``stack`` fixture on free loopback ports and stopped by it, also when a
test fails. The
flow runs reach the mock model server of this test process over HTTP, so the
tests count the requests each prompt made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.conftest import jsonl_rows, model_requests, write_prompts
from tests.prefect_stack import REPO, TERMINAL, api_call

pytestmark = pytest.mark.slow


def test_deployment_run_with_parameters(stack, mock_server, tmp_path):
    prompts = [f"deployment run prompt {i} ({stack.api})" for i in range(4)]
    config = {
        "dataset_file": str(write_prompts(tmp_path / "d.jsonl", prompts)),
        "batch_size": 3,
        "run_name": "deployed",
        "model": "mock/scripted",
        "base_url": mock_server.base_url,
        "distribution": "terminal_only",
        "output_dir": str(tmp_path / "data"),
    }
    run = stack.wait(stack.run_deployment("generate", config))
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["parameters"]["run_name"] == "deployed"
    assert run["parameters"]["max_turns"] == 10 and run["parameters"]["num_workers"] == 4  # prefect.yaml's
    rows = jsonl_rows(tmp_path / "data" / "deployed" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in rows] == prompts
    assert all(r["completed"] and r["api_calls"] == 3 for r in rows)
    assert [model_requests(mock_server, p) for p in prompts] == [3] * 4
    stats = json.loads((tmp_path / "data" / "deployed" / "statistics.json").read_text())
    assert stats["completed"] == 4 and stats["failed"] == 0
    artifacts = httpx.post(
        f"{stack.api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run["id"]]}}}
    ).json()
    assert {a["key"] for a in artifacts} >= {"deployed-progress", "deployed-tool-stats", "deployed-summary"}


def _failing_config(
    tmp_path: Path, mock_server, tag: str, gate: Path, run_name: str
) -> tuple[dict, list[str]]:
    prompts = [f"{tag} prompt {i}" for i in range(5)]
    prompts[2] = f"[mock:fail_file={gate}] {tag} prompt 2"
    config = {
        "dataset_file": str(write_prompts(tmp_path / "f.jsonl", prompts)),
        "batch_size": 2,
        "run_name": run_name,
        "model": "mock/scripted",
        "base_url": mock_server.base_url,
        "distribution": "terminal_only",
        "output_dir": str(tmp_path / "data"),
        "retries": 0,
    }
    return config, prompts


def test_failed_run_then_ui_style_retry_reruns_only_failed_prompts(stack, mock_server, tmp_path):
    gate = tmp_path / "provider-down"
    gate.write_text("down")
    config, prompts = _failing_config(tmp_path, mock_server, f"retry {stack.port}", gate, "retried")
    flow_run_id = stack.run_deployment("generate", config)
    run = stack.wait(flow_run_id)
    assert run["state"]["type"] == "FAILED"
    assert run["state"]["message"].startswith("1 of 5 prompts failed")
    before = [model_requests(mock_server, p) for p in prompts]
    assert [before[i] for i in (0, 1, 3, 4)] == [3, 3, 3, 3]

    gate.unlink()
    stack.retry_like_the_ui(flow_run_id)
    run = stack.wait(flow_run_id)
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["run_count"] == 2
    after = [model_requests(mock_server, p) for p in prompts]
    assert [a - b for a, b in zip(after, before, strict=True)] == [0, 0, 3, 0, 0]
    rows = jsonl_rows(tmp_path / "data" / "retried" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in rows] == prompts


def test_nightly_schedule_and_dated_run_name(stack, mock_server, tmp_path):
    deployment = api_call("GET", f"{stack.api}/deployments/name/generate-trajectories/nightly").json()
    schedules = [s["schedule"] for s in deployment["schedules"]]
    assert schedules == [{"cron": "0 2 * * *", "timezone": "UTC", "day_or": True}]
    assert deployment["parameters"]["run_name"] == "nightly-{date}"

    gate = tmp_path / "night-provider-down"
    gate.write_text("down")
    config, prompts = _failing_config(tmp_path, mock_server, f"nightly {stack.port}", gate, "nightly-{date}")
    scheduled = datetime(2026, 1, 15, 2, 0, tzinfo=UTC)
    reply = api_call(
        "POST",
        f"{stack.api}/deployments/{deployment['id']}/create_flow_run",
        json={
            "parameters": {**deployment["parameters"], **config},
            "state": {"type": "SCHEDULED", "state_details": {"scheduled_time": scheduled.isoformat()}},
        },
    )
    assert reply.status_code in (200, 201), reply.text
    flow_run_id = reply.json()["id"]
    assert stack.wait(flow_run_id)["state"]["type"] == "FAILED"
    night = tmp_path / "data" / "nightly-2026-01-15"
    assert len(jsonl_rows(night / "trajectories.jsonl")) == 4

    gate.unlink()  # a retried night continues the same run folder
    stack.retry_like_the_ui(flow_run_id)
    assert stack.wait(flow_run_id)["state"]["type"] == "COMPLETED"
    assert [r["conversations"][1]["value"] for r in jsonl_rows(night / "trajectories.jsonl")] == prompts
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["nightly-2026-01-15"]


@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)  # same UI and API call on either database
def test_retry_clicked_in_the_real_ui(stack, mock_server, tmp_path):
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        if os.environ.get("CI"):
            raise RuntimeError("chromium missing: .ci/run must install Debian's chromium")
        pytest.skip("chromium not installed")
    from playwright.sync_api import sync_playwright

    gate = tmp_path / "ui-provider-down"
    gate.write_text("down")
    config, prompts = _failing_config(tmp_path, mock_server, f"ui {stack.port}", gate, "ui-retried")
    flow_run_id = stack.run_deployment("generate", config)
    assert stack.wait(flow_run_id)["state"]["type"] == "FAILED"
    before = [model_requests(mock_server, p) for p in prompts]
    gate.unlink()

    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )  # fmt: skip
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.route(re.compile(r"^(?!http://127\.0\.0\.1).*"), lambda route: route.abort())
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{stack.port}/runs/flow-run/{flow_run_id}", wait_until="networkidle")
            page.get_by_role("button", name="Retry", exact=True).click()
            page.get_by_role("dialog").get_by_role("button", name="Retry").click()
            run = {}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                run = httpx.get(f"{stack.api}/flow_runs/{flow_run_id}").json()
                if run["run_count"] == 2 and run["state"]["type"] in TERMINAL:
                    break
                time.sleep(0.5)
            page.reload(wait_until="networkidle")
            page.screenshot(path=str(artifacts / "ui-retry.png"), full_page=True)
        finally:
            browser.close()
    assert run["state"]["type"] == "COMPLETED", run["state"]
    states = httpx.get(f"{stack.api}/flow_run_states/", params={"flow_run_id": flow_run_id}).json()
    names = [s["name"] for s in sorted(states, key=lambda s: s["timestamp"])]
    assert "AwaitingRetry" in names and names[-1] == "Completed", names
    after = [model_requests(mock_server, p) for p in prompts]
    assert [a - b for a, b in zip(after, before, strict=True)] == [0, 0, 3, 0, 0]
    assert (artifacts / "ui-retry.png").stat().st_size > 10_000


def _holders(hold: Path) -> list[int]:
    """Pids of live processes whose command line waits on the ``hold`` file."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.info["cmdline"] and any(hold.name in part for part in proc.info["cmdline"]):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)  # the worker's cancel path does not depend on it
def test_cancel_like_the_ui_stops_every_prompt_and_a_resume_completes(stack, mock_server, tmp_path):
    work = tmp_path / "work"  # the held records' cwd: bound writable into each prompt's sandbox
    work.mkdir()
    hold = work / f"hold-{stack.port}"
    hold.write_text("x")
    quick = [f"cancel quick prompt {i} ({stack.port})" for i in range(2)]
    held = [
        f"[mock:command=while test -f {hold.name}; do sleep 0.2; done] cancel held {i} ({stack.port})"
        for i in range(4)
    ]
    dataset = tmp_path / "c.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"prompt": p, **({"cwd": str(work)} if p in held else {})}) + "\n"
            for p in quick + held
        )
    )
    config = {
        "dataset_file": str(dataset),
        "batch_size": 2,
        "run_name": "cancelled",
        "model": "mock/scripted",
        "base_url": mock_server.base_url,
        "distribution": "terminal_only",
        "output_dir": str(tmp_path / "data"),
        "num_workers": 4,
    }
    run_dir = tmp_path / "data" / "cancelled"
    flow_run_id = stack.run_deployment("generate", config)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and (
        len(_holders(hold)) < 4 or not (run_dir / "batch_0.jsonl").exists()
    ):
        time.sleep(0.3)
    assert len(_holders(hold)) >= 4, "the held prompts never started"
    rows_before = jsonl_rows(run_dir / "batch_0.jsonl")

    started = time.monotonic()
    stack.cancel_like_the_ui(flow_run_id)
    run = stack.wait(flow_run_id, timeout=60)
    cancelled_in = time.monotonic() - started
    assert run["state"]["type"] == "CANCELLED" and cancelled_in < 15, (run["state"], cancelled_in)
    time.sleep(0.5)
    assert _holders(hold) == []  # every sandbox command is gone
    assert jsonl_rows(run_dir / "batch_0.jsonl") == rows_before
    print(f"cancel -> Cancelled in {cancelled_in:.1f} s, 0 leftover processes")

    hold.unlink()
    resumed = stack.wait(stack.run_deployment("generate", {**config, "resume": True}))
    assert resumed["state"]["type"] == "COMPLETED", resumed["state"]
    rows = jsonl_rows(run_dir / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in rows] == quick + held
    assert [model_requests(mock_server, p) for p in quick] == [3, 3]
