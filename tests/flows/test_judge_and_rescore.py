"""The judge and python scorers in a run, and ``hermes-batch score`` on a finished run.

Real subprocesses of the command line, a real Prefect server, the mock model over HTTP (it judges
for the model id ``mock/judge``), real sandboxes.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from hermes_core.mockllm import MockServer
from hermes_core.runfolder.spend import SpendTally
from hermes_core.scoring import JUDGE_RUBRIC, judge_messages
from tests.conftest import conversation_key, run_args

pytestmark = pytest.mark.slow

RECORDS = [
    {"prompt": "[mock:answer=Paris,cost=0.01] What is the capital of France?", "answer": "Paris"},
    {"prompt": "[mock:answer=London,cost=0.01] Capital of France, please?", "answer": "Paris"},
    {"prompt": "[mock:answer=hello,cost=0.01] Say hello."},
]
TURN_SCORER = (
    "def enough(row, record):\n"
    "    n = len(row['conversations'])\n"
    "    return {'value': n / 10, 'passed': n >= 3, 'explanation': f\"{n} turns, {record['prompt'][-6:]}\"}\n"
)


@pytest.fixture
def server(tmp_path):
    with MockServer(request_log=str(tmp_path / "requests.jsonl")) as srv:
        yield srv


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _final(row: dict) -> str:
    return [turn["value"] for turn in row["conversations"] if turn["from"] == "gpt"][-1]


def test_the_judge_and_a_python_scorer_score_each_row_and_the_judge_is_paid_for(cli, server):
    dataset = _write(cli.cwd / "judged.jsonl", RECORDS)
    (cli.cwd / "turn_scorer.py").write_text(TURN_SCORER)
    scorers = "--scorer=judge,python:turn_scorer:enough"
    proc = cli(*run_args(dataset, "judged", server, scorers, "--judge_model=mock/judge", "--num_workers=1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "judged"
    rows = _rows(run / "trajectories.jsonl")
    judged = [row["metadata"]["score"]["judge"] for row in rows]
    assert judged == [
        {"value": 1.0, "passed": True, "explanation": "The final answer matches the reference answer."},
        {"value": 0.0, "passed": False, "explanation": "The final answer differs from the reference answer."},
        {
            "value": 1.0,
            "passed": True,
            "explanation": "The agent gave a final answer and there is no reference to compare.",
        },
    ]
    turns = [len(row["conversations"]) for row in rows]
    assert [row["metadata"]["score"]["python:turn_scorer:enough"] for row in rows] == [
        {"value": n / 10, "passed": True, "explanation": f"{n} turns, {r['prompt'][-6:]}"}
        for n, r in zip(turns, RECORDS, strict=True)
    ]
    assert [row["metadata"]["passed"] for row in rows] == [True, False, True]
    # one judge request per row, in the judge's own conversation, besides the agent's 3 requests
    by_conversation = server.stats()["by_conversation"]
    assert [by_conversation[conversation_key(r["prompt"])] for r in RECORDS] == [3, 3, 3]
    for row, record in zip(rows, RECORDS, strict=True):
        case = judge_messages(record["prompt"], _final(row), record.get("answer"), JUDGE_RUBRIC)[1]["content"]
        assert by_conversation[conversation_key(case)] == 1
    assert server.stats()["requests"] == 12
    # the judge's request is in each row's usage (4 requests at $0.01) and in the run's cost
    assert [row["metadata"]["usage"]["cost"] for row in rows] == [0.04, 0.04, 0.04]
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["cost_usd"] == 0.12
    assert stats["scores"]["judge"] == {"scored": 3, "passed": 2, "failed": 1, "errored": 0, "mean": 0.6667}
    assert stats["scores"]["python:turn_scorer:enough"]["passed"] == 3


def test_the_judge_counts_against_the_spend_cap(cli, server):
    """Without the judge the three prompts cost $0.09 and fit a $0.10 cap; with it each costs $0.04."""
    dataset = _write(cli.cwd / "capped.jsonl", RECORDS)
    priced = "mock/scripted?cost=0.01"  # the cap needs a cost source known at the start
    args = ["--scorer=judge", "--judge_model=mock/judge", "--num_workers=1", "--max_cost_usd=0.1"]
    unjudged = cli(
        *run_args(dataset, "unjudged", server, "--num_workers=1", "--max_cost_usd=0.1", model=priced)
    )
    assert unjudged.returncode == 0, unjudged.stderr[-3000:]
    assert len(_rows(cli.cwd / "data" / "unjudged" / "trajectories.jsonl")) == 3
    proc = cli(*run_args(dataset, "capped", server, *args, model=priced))
    assert proc.returncode == 3, proc.stderr[-3000:]  # the cap was reached
    run = cli.cwd / "data" / "capped"
    rows = _rows(run / "trajectories.jsonl")
    assert len(rows) == 2 and all(row["metadata"]["usage"]["cost"] == 0.04 for row in rows)
    assert json.loads((run / "statistics.json").read_text())["cost_usd"] <= 0.1 + 1e-9


def test_score_rescores_without_the_agent_and_a_killed_score_loses_nothing(cli, server):
    records = [
        {"prompt": "[mock:answer=Paris] Capital of France?", "answer": "Paris"},
        {"prompt": "[mock:answers=4|5] What is 2 + 2?", "answer": "4"},
    ]
    dataset = _write(cli.cwd / "scored.jsonl", records)
    proc = cli(*run_args(dataset, "scored", server, "--samples_per_prompt=2", "--scorer=answer"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "scored"
    batches = {path.name: path.read_bytes() for path in run.glob("batch_*.jsonl")}
    # which sample of record 1 answered 4 (passed) and which 5, in the order the merge writes them
    answered_4 = [r["metadata"]["passed"] for r in _rows(run / "trajectories.jsonl")][2:]
    assert sorted(answered_4) == [False, True]
    before = json.loads((run / "statistics.json").read_text())
    assert before["scores"]["answer"]["passed"] == 3 and before["pass_at_k"] == {"1": 0.75, "2": 1.0}
    requests = server.stats()["requests"]

    # the reference answers corrected in the dataset: scored again, no agent request
    fixed = _write(cli.cwd / "fixed.jsonl", [{**records[0], "answer": "Lyon"}, {**records[1], "answer": "5"}])
    rescored = cli("score", str(run), "--scorer=answer", f"--dataset={fixed}")
    assert rescored.returncode == 0, rescored.stderr[-3000:]
    assert "Scored 4 row(s); 0 already scored" in rescored.stdout
    assert server.stats()["requests"] == requests
    rows = _rows(run / "trajectories.jsonl")
    # now only record 1's sample that answered 5 passes
    assert [(r["prompt_index"], r["metadata"]["passed"]) for r in rows] == [
        (0, False), (0, False), (1, not answered_4[0]), (1, not answered_4[1]),
    ]  # fmt: skip
    assert [r["metadata"]["score"]["answer"]["explanation"] for r in rows if r["metadata"]["passed"]] == [
        "matches '5'"
    ]
    after = json.loads((run / "statistics.json").read_text())
    assert after["scores"]["answer"] == {"scored": 4, "passed": 1, "failed": 3, "errored": 0, "mean": 0.25}
    assert after["pass_at_k"] == {"1": 0.25, "2": 0.5}
    assert {path.name: path.read_bytes() for path in run.glob("batch_*.jsonl")} == batches  # never rewritten
    again = cli("score", str(run), "--scorer=answer", f"--dataset={fixed}")
    assert "Scored 0 row(s); 4 already scored" in again.stdout
    # the judge of score: its requests (4 at $0.01) are the run's spend, though no prompt's
    judged = cli(
        "score",
        str(run),
        "--scorer=judge",
        "--judge_model=mock/judge?cost=0.01",
        f"--judge_base_url={server.base_url}",
    )
    assert judged.returncode == 0, judged.stderr[-3000:]
    assert "Judge: " in judged.stdout and "$0.0400" in judged.stdout
    spend = SpendTally.load(run)
    assert spend.total.cost == pytest.approx(0.04) and spend.total.records == 4  # the 4 rows, not the judge
    requests += 4

    # a slow python scorer killed mid-way: the rows it scored stay scored, the rest are scored next time
    (cli.cwd / "slow_scorer.py").write_text(
        "import time\n"
        "def slow(row, record):\n"
        "    time.sleep(1.0)\n"
        "    return {'passed': True, 'explanation': row['metadata']['prompt_id']}\n"
    )
    proc = cli.spawn("score", str(run), "--scorer=python:slow_scorer:slow", "--num_workers=1")
    scores = run / "scores.jsonl"
    deadline = time.monotonic() + 60
    while len(_lines_of(scores, "python:slow_scorer:slow")) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    first = len(_lines_of(scores, "python:slow_scorer:slow"))
    assert 1 <= first < 4
    finished = cli("score", str(run), "--scorer=python:slow_scorer:slow", "--num_workers=2")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"Scored {4 - first} row(s); {first} already scored" in finished.stdout
    lines = _lines_of(scores, "python:slow_scorer:slow")
    assert sorted(line["prompt_id"] for line in lines) == sorted(r["metadata"]["prompt_id"] for r in rows)
    rows = _rows(run / "trajectories.jsonl")
    assert all(r["metadata"]["score"]["python:slow_scorer:slow"]["passed"] for r in rows)
    assert [r["metadata"]["score"]["answer"]["passed"] for r in rows] == [
        False, False, not answered_4[0], not answered_4[1],
    ]  # fmt: skip
    assert server.stats()["requests"] == requests

    refused = cli("score", str(run), "--scorer=verify")
    assert refused.returncode == 2
    assert "verify cannot re-score: a verify command runs in the prompt's own sandbox" in refused.stderr


def _lines_of(path: Path, scorer: str) -> list[dict]:
    """The whole lines of scores.jsonl with a result of ``scorer`` (a torn last line is not one)."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if scorer in line.get("score", {}):
            lines.append(line)
    return lines
