"""``--stop_when_passed`` end to end: the command line, a real Prefect server, the mock over HTTP.

Three records, K = 4, one worker (so the order is exact): sample-major dispatch runs every
record's sample 0, then every record's sample 1, ...; the samples of a record that has passed do
not start. Each sample takes 3 model requests (``terminal_only``: a tool call, its follow-up, the answer).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from hermes_core.mockllm import MockServer
from tests.conftest import conversation_key, run_args

pytestmark = pytest.mark.slow

RECORDS = [
    {"prompt": "[mock:answers=London|Paris] What is the capital of France?", "answer": "Paris"},  # fail, pass
    {"prompt": "[mock:answer=Paris] What is the capital of France, again?", "answer": "Paris"},  # pass
    {"prompt": "[mock:answer=London] And the capital of France?", "answer": "Paris"},  # never passes
]
RUN_SAMPLES = [2, 1, 4]  # samples that run per record: 12 - 7 = 5 skipped
REQUESTS_PER_SAMPLE = 3


@pytest.fixture
def server(tmp_path):
    with MockServer(request_log=str(tmp_path / "requests.jsonl")) as srv:
        yield srv


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _requests(server) -> list[int]:
    by_conversation = server.stats()["by_conversation"]
    return [by_conversation.get(conversation_key(r["prompt"]), 0) for r in RECORDS]


def test_samples_of_a_passed_record_do_not_start_and_a_resume_keeps_them_skipped(cli, server, tmp_path):
    dataset = cli.cwd / "stop.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    args = run_args(dataset, "stop", server, "--samples_per_prompt=4", "--num_workers=1")
    proc = cli(*args, "--stop_when_passed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 7 samples x 3 requests instead of 12 x 3
    assert _requests(server) == [n * REQUESTS_PER_SAMPLE for n in RUN_SAMPLES]
    assert server.stats()["requests"] == 21
    # sample-major: every record's sample 0, then sample 1 of the records that have not passed, ...
    log = [
        json.loads(line)["conversation"] for line in (tmp_path / "requests.jsonl").read_text().splitlines()
    ]
    keys = [conversation_key(r["prompt"]) for r in RECORDS]
    order = [keys.index(key) for key in log[::REQUESTS_PER_SAMPLE]]
    assert order == [0, 1, 2, 0, 2, 2, 2]
    run = cli.cwd / "data" / "stop"
    rows = _rows(run / "trajectories.jsonl")
    assert [(r["prompt_index"], r["metadata"]["sample_index"], r["metadata"]["passed"]) for r in rows] == [
        (0, 0, False),
        (0, 1, True),
        (1, 0, True),
        (2, 0, False),
        (2, 1, False),
        (2, 2, False),
        (2, 3, False),
    ]
    assert not (run / "failures.jsonl").exists()  # skipped samples are not failures
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["completed"] == 7 and stats["failed"] == 0
    assert stats["stopped_when_passed"] == {
        "samples_skipped": 5,
        "requests_saved_estimate": 15.0,  # 5 x 3 requests per row
        "cost_saved_usd_estimate": None,  # the mock reports no cost
    }
    # pass@4 exact (records 0 and 1 passed, 2 ran its 4 samples); pass@1 from each record's sample 0
    assert stats["pass_at_k"] == {"1": 0.3333, "4": 0.6667}
    assert stats["pass_hat_k"] is None
    saving = "5 samples skipped; saved about 15 model requests (estimates: skipped x the mean per row)"
    assert f"Stopped when passed: {saving}" in proc.stdout
    assert "7 trajectories, 0 discarded, 0 failed, 5 skipped (their record passed)" in proc.stderr
    # the live figures: the console's last progress line and the progress artifact show the pass rate
    assert "prompts 7/7 · failed 0 · discarded 0 · skipped 5 · pass 2/7 · " in proc.stderr
    artifacts = {
        a["key"]: a
        for a in httpx.post(
            f"{cli.api_url}/artifacts/filter",
            json={"artifacts": {"key": {"any_": ["stop-progress", "stop-summary"]}}},
        ).json()
    }
    assert artifacts["stop-progress"]["data"] == 100
    assert artifacts["stop-progress"]["description"].startswith(
        "7/7 prompts of stop in this flow run (0 failed, 5 skipped) · pass 2/7 · run "
    )
    assert f"| stopped when passed | {saving} |" in artifacts["stop-summary"]["data"]

    # a resume with the option runs nothing: the ledger's passing rows keep the samples skipped
    resumed = cli(*args, "--stop_when_passed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert server.stats()["requests"] == 21
    assert "7 already finished, 5 skipped (their record passed), 0 to run" in resumed.stderr
    assert json.loads((run / "statistics.json").read_text())["stopped_when_passed"]["samples_skipped"] == 5

    # the option is not defining: a resume without it runs the 5 skipped samples, and only them
    full = cli(*args, "--resume")
    assert full.returncode == 0, full.stderr[-3000:]
    assert _requests(server) == [4 * REQUESTS_PER_SAMPLE] * 3
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["completed"] == 12 and "stopped_when_passed" not in stats
    # record 0 alternates (2 of 4), record 1 always passes, record 2 never: the usual estimator again
    assert stats["pass_at_k"] == {"1": 0.5, "4": 0.6667} and stats["pass_hat_k"] == 0.3333
