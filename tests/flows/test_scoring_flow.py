"""Scored runs end to end: the command line, a real Prefect server, the mock over HTTP, real sandboxes.

``examples/verified.jsonl``: three records with an ``answer`` (the mock told what to answer), three
with a ``verify`` command that checks what the agent's terminal command wrote in its folder, and
one whose samples answer wrong and right in turn (pass@1 < pass@4).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hermes_core.mockllm import MockServer
from tests.conftest import conversation_key, run_args

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXPECTED = [  # (scorer, passed, explanation) per record of examples/verified.jsonl
    ("answer", True, "matches 'Paris.'"),
    ("answer", True, "matches '42'"),  # from its ANSWER: line
    ("answer", False, "'London' is not one of ['Paris']"),
    ("verify", True, "exit 0"),
    ("verify", False, "exit 1"),
    ("verify", True, "exit 0"),
    ("answer", False, "'Lyon' is not one of ['Paris']"),  # its first sample; the second answers Paris
]


@pytest.fixture
def server(tmp_path):
    with MockServer(request_log=str(tmp_path / "requests.jsonl")) as srv:
        yield srv


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_example_is_scored_in_the_rows_the_statistics_and_the_console(cli, server):
    dataset = shutil.copy(REPO / "examples" / "verified.jsonl", cli.cwd / "verified.jsonl")
    args = run_args(dataset, "verified", server, "--batch_size=3")
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "verified"
    rows = _rows(run / "trajectories.jsonl")
    got = [
        (name, score["passed"], score["explanation"])
        for row in rows
        for name, score in row["metadata"]["score"].items()
    ]
    assert got == EXPECTED
    assert [row["metadata"]["passed"] for row in rows] == [passed for _, passed, _ in EXPECTED]
    assert [row["metadata"]["score"][name]["value"] for row, (name, _, _) in zip(rows, EXPECTED, strict=True)] == [
        1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0,
    ]  # fmt: skip
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["scores"] == {
        "answer": {"scored": 4, "passed": 2, "failed": 2, "errored": 0, "mean": 0.5},
        "verify": {"scored": 3, "passed": 2, "failed": 1, "errored": 0, "mean": 0.6667},
    }
    assert "Scores: answer 2/4 passed (mean 0.5) · verify 2/3 passed (mean 0.6667)" in proc.stdout
    assert "Pass: pass@1 0.5714" in proc.stdout and "pass^" not in proc.stdout  # K = 1: no pass^K
    requests = server.stats()["requests"]
    resumed = cli(*args, "--resume")  # nothing to do: scored rows are finished work
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert server.stats()["requests"] == requests
    assert json.loads((run / "statistics.json").read_text())["scores"] == stats["scores"]
    # rejection sampling afterwards: --keep is not defining, the merge applies it, nothing runs again
    kept = cli(*args, "--resume", "--keep=passed")
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert server.stats()["requests"] == requests
    assert [r["prompt_index"] for r in _rows(run / "trajectories.jsonl")] == [0, 1, 3, 5]
    assert [r["prompt_index"] for r in _rows(run / "rejected.jsonl")] == [2, 4, 6]
    assert all(r["metadata"]["passed"] is False for r in _rows(run / "rejected.jsonl"))
    after = json.loads((run / "statistics.json").read_text())
    assert after["kept_by_filter"] == {"keep": "passed", "kept": 4, "rejected": 3}
    assert after["completed"] == 4 and after["scores"] == stats["scores"]  # the rejected rows still count


def test_verify_timeout_and_explicit_scorers(cli, server):
    records = [
        {"prompt": "[mock:command=true] wait", "verify": "sleep 30", "answer": "no"},
        {"prompt": "[mock:answer=yes] say yes", "answer": "Yes!", "verify": "true"},
        {"prompt": "[mock:answer=no] nothing to score"},
    ]
    dataset = cli.cwd / "explicit.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    proc = cli(*run_args(dataset, "explicit", server, "--scorer=answer,verify", "--verify_timeout=1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(cli.cwd / "data" / "explicit" / "trajectories.jsonl")
    first, second, third = (row["metadata"] for row in rows)
    assert list(first["score"]) == ["answer", "verify"]
    assert first["score"]["verify"] == {"value": 0.0, "passed": False, "explanation": "timed out after 1 s"}
    assert first["passed"] is False
    assert second["score"]["answer"]["passed"] and second["score"]["verify"]["passed"] and second["passed"]
    assert "score" not in third and "passed" not in third  # a record with neither field is not scored
    assert [server.stats()["by_conversation"][conversation_key(r["prompt"])] for r in records] == [3, 3, 3]


def test_k_samples_give_exact_pass_at_k_and_more_samples_add_to_a_run(cli, server):
    records = [
        {"prompt": "[mock:answers=Paris|London] What is the capital of France?", "answer": "Paris"},  # 2 of 4
        {"prompt": "[mock:answer=Paris] What is the capital of France, again?", "answer": "Paris"},  # 4 of 4
        {"prompt": "[mock:answer=London] And the capital of France?", "answer": "Paris"},  # 0 of 4
    ]
    dataset = cli.cwd / "k.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    args = run_args(dataset, "k", server, "--batch_size=4", "--distribution=default")
    proc = cli(*args, "--samples_per_prompt=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "k"
    rows = _rows(run / "trajectories.jsonl")
    assert [(r["prompt_index"], r["metadata"]["sample_index"]) for r in rows] == [
        (i, j) for i in range(3) for j in range(4)
    ]
    assert [sum(r["metadata"]["passed"] for r in rows if r["prompt_index"] == i) for i in range(3)] == [
        2,
        4,
        0,
    ]
    for i in range(3):  # one toolset draw per record: its samples are a group with the same tools
        assert len({tuple(r["toolsets_used"]) for r in rows if r["prompt_index"] == i}) == 1
    assert len({r["metadata"]["prompt_id"] for r in rows}) == 12  # each sample is its own prompt
    stats = json.loads((run / "statistics.json").read_text())
    # Chen et al.'s estimator per record (n=4): c=2 -> pass@1 0.5, pass@4 1; c=4 -> 1, 1; c=0 -> 0, 0
    assert stats["pass_at_k"] == {"1": 0.5, "4": 0.6667}
    assert stats["pass_hat_k"] == 0.3333
    assert "Pass: pass@1 0.5 · pass@4 0.6667 · pass^4 0.3333" in proc.stdout  # the console summary
    from flows.config import BatchConfig
    from tasks.statistics import summary_markdown

    config = BatchConfig.from_options(dataset_file=str(dataset), batch_size=4, run_name="k")
    assert "| pass@k | pass@1 0.5 · pass@4 0.6667 · pass^4 0.3333 |" in summary_markdown(config, stats)
    assert stats["total_prompts"] == 12 and stats["completed"] == 12
    by_conversation = server.stats()["by_conversation"]
    assert [by_conversation[conversation_key(r["prompt"])] for r in records] == [12, 12, 12]  # 4 x 3 requests

    # a resume with more samples runs only the new ones
    more = cli(*args, "--samples_per_prompt=6", "--resume", "--keep=best")
    assert more.returncode == 0, more.stderr[-3000:]
    by_conversation = server.stats()["by_conversation"]
    assert [by_conversation[conversation_key(r["prompt"])] for r in records] == [18, 18, 18]
    best = _rows(run / "trajectories.jsonl")
    assert [r["prompt_index"] for r in best] == [0, 1, 2]  # --keep best: one sample per record
    assert [r["metadata"]["passed"] for r in best] == [True, True, False]
    assert len(_rows(run / "rejected.jsonl")) == 15
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["pass_at_k"] == {"1": 0.5, "6": 0.6667}  # record 0 now 3 of 6: pass@1 still 0.5
