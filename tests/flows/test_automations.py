"""The notification automation (deployments/automations.yaml, deployments/notify.py) on a real Prefect server.

The session's ``prefect server`` runs Prefect's event services (triggers, actions): a flow run that
ends Failed makes the automation POST the message of its webhook block to a local receiver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pytest_httpserver import HTTPServer

from hermes_core.mockllm import MockServer
from tests.conftest import run_args

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_a_failed_run_posts_its_state_progress_and_spend_to_the_webhook(cli, tmp_path):
    receiver = HTTPServer(host="127.0.0.1", threaded=True)
    receiver.expect_request("/hook", method="POST").respond_with_data("ok")
    receiver.start()
    env = {"PREFECT_API_URL": cli.api_url, "PREFECT_HOME": str(tmp_path / "notify-home")}
    try:
        setup = subprocess.run(
            [sys.executable, str(REPO / "deployments" / "notify.py"), "--webhook", receiver.url_for("/hook")],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert setup.returncode == 0, setup.stderr[-3000:]
        assert "automation hermes-batch-run-ended-badly" in setup.stdout, setup.stdout
        time.sleep(2)  # the server's triggers service loads the new automation
        with MockServer() as server:
            dataset = cli.cwd / "notify.jsonl"
            prompts = ["notify ok 0", "notify ok 1", "notify fails [mock:error_5xx=100]"]
            dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
            model = "mock/scripted?cost=0.001"
            proc = cli(*run_args(dataset, "notify-run", server, "--retries=0", model=model))
        assert proc.returncode == 1, proc.stderr[-3000:]
        deadline = time.monotonic() + 60
        while not receiver.log and time.monotonic() < deadline:
            time.sleep(0.5)
        assert receiver.log, "no notification reached the webhook"
        posted = receiver.log[0][0].get_json()
        assert posted["subject"] == "hermes-batch: run notify-run ended Failed", posted
        body = posted["body"]
        assert "of generate-trajectories ended Failed (FAILED)" in body, body
        assert "Run: notify-run · model mock/scripted?cost=0.001" in body, body
        # what was done and what was spent: the flow run's final message
        assert "1 of 3 prompts failed" in body and "2 trajectories, the run spent " in body, body
        assert "$0.0060" in body, body  # 2 prompts x 3 requests x $0.001
    finally:
        receiver.clear()
        receiver.stop()
        with httpx.Client(base_url=cli.api_url) as api:  # leave no automation for the session's other tests
            found = api.post("/automations/filter", json={}).json()
            for automation in found:
                if automation["name"] == "hermes-batch-run-ended-badly":
                    api.delete(f"/automations/{automation['id']}")
