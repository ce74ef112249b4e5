"""A small scored run folder with two samples per record, written by the product's own code.

Like :func:`tests.run_folders.build_run`: rows from :func:`hermes_core.runner.build_row` over the
hand-written conversations of :func:`tests.run_folders.conversation`, the ``answer`` score from
:func:`hermes_core.scoring.score_answer` (as the runner adds it), the ledger, the merge and the
statistics of :mod:`hermes_core.runfolder`. A ``verify`` result cannot be run without a sandbox, so
it is written in :func:`hermes_core.scoring.score_verify`'s shape (:data:`VERIFY_FAIL`).

Records (``SCORED_RECORDS``) and what their two samples do::

    0 capital   answer Paris    right, wrong        -> passed, failed
    1 product   answer 42       right, right        -> passed, passed
    2 tests     verify          exit 1, exit 0      -> failed, passed
    3 sandbox   answer x        infra failure, wrong -> errored, failed
    4 chat      (no scorer)     kept, kept          -> not scored

pass@1 = (1/2 + 1 + 1/2 + 0) / 4 = 0.5; pass@2 over the records with 2 scored samples
(0, 1, 2) = 1.0; pass^2 = 1/3.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flows.config import BatchConfig
from hermes_core.agent import AgentResult
from hermes_core.client import Usage
from hermes_core.dataset import read_dataset
from hermes_core.runfolder.ledger import RunLedger
from hermes_core.runfolder.postprocess import compute_statistics, merge_trajectories, write_json_atomic
from hermes_core.runfolder.run_info import finish_invocation, jobs_of, start_invocation
from hermes_core.runner import build_row
from hermes_core.scoring import score_answer
from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tests.run_folders import TERMINAL_TOOL, TEST_FLOW_RUN_ID, conversation

VERIFY_FAIL = {
    "value": 0.0,
    "passed": False,
    "explanation": "exit 1: FAILED test_app.py::test_title - <b>assert</b> 'Hello' == \"Hi\"\n1 failed in 0.02s",
}
VERIFY_PASS = {"value": 1.0, "passed": True, "explanation": "exit 0: 1 passed in 0.01s"}

SCORED_RECORDS: list[tuple[dict[str, Any], tuple[str, str]]] = [
    ({"prompt": "What is the capital of France?", "answer": "Paris"}, ("Paris", "London")),
    ({"prompt": "What is six times seven?", "answer": "42"}, ("42", "The answer is 42.\nANSWER: 42")),
    ({"prompt": "Make the tests pass", "verify": "python3 -m pytest -q"}, ("verify-fail", "verify-pass")),
    ({"prompt": "Break the sandbox", "answer": "x"}, ("infra", "y")),
    ({"prompt": "Just chat with me"}, ("Hello.", "Hi.")),
]
"""(dataset record, what each of its two samples does: a final answer, ``verify-fail``,
``verify-pass`` or ``infra``, an infrastructure failure)."""

SAMPLES = 2


def prompt_ids(run_dir: Path) -> list[str]:
    """The prompt_ids of the run by slot (``prompt_index * 2 + sample_index``)."""
    info = json.loads((run_dir / "run.json").read_text())
    ds = read_dataset(run_dir.parent.parent / "scored.jsonl")
    return [j.prompt_id for j in jobs_of(ds, info["settings_hash"], SAMPLES)]


def build_scored_run(root: Path, *, run_name: str = "scored", keep: str = "all") -> Path:
    """Write the finished run ``root/data/<run_name>`` of :data:`SCORED_RECORDS` (dataset
    ``root/scored.jsonl``), merged with ``keep``; returns the run folder."""
    dataset = root / "scored.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r, _ in SCORED_RECORDS), encoding="utf-8")
    config = BatchConfig.from_options(
        dataset_file=str(dataset),
        batch_size=4,
        run_name=run_name,
        output_dir=str(root / "data"),
        model="mock/scripted",
        distribution="terminal_only",
        samples_per_prompt=SAMPLES,
        keep=keep,
    )
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    ds = read_dataset(dataset)
    jobs = jobs_of(ds, config.settings_hash(), SAMPLES)
    info = start_invocation(
        run_dir,
        run_name,
        config.defining_settings(),
        config.settings_hash(),
        ds,
        TEST_FLOW_RUN_ID,
        samples=SAMPLES,
    )
    ledger = RunLedger.open(run_dir, run_name)
    index_of = {j.prompt_id: j.prompt_index for j in jobs}
    ledger.plan([(j.prompt_index, j.prompt_id) for j in jobs], 4, index_of)
    spec = config.run_spec()
    failed = []
    for job in jobs:
        record, outcomes = SCORED_RECORDS[job.prompt_index]
        outcome = outcomes[job.sample_index]
        if outcome == "infra":
            ledger.record_failure(
                job.prompt_id,
                job.prompt_index,
                "SandboxError",
                "the sandbox died <i>mid-prompt</i>",
                3,
                kind="infra",
            )
            failed.append(job.prompt_id)
            continue
        messages = conversation("kept", record["prompt"])
        final = "Done." if outcome.startswith("verify") else outcome
        messages[-1]["content"] = final
        result = AgentResult(
            messages=messages,
            tools=[TERMINAL_TOOL],
            api_calls=2,
            completed=True,
            partial=False,
            stop_reason="final_answer",
            usage=Usage(prompt_tokens=100, completion_tokens=20, reasoning_tokens=5, cost=0.001),
            duration_s=0.25,
        )
        row = build_row(job, spec, result, ["terminal"], attempt=1, duration_s=0.25)
        if "verify" in record:  # the runner's rule: auto = verify when the record has one
            score = {"verify": VERIFY_FAIL if outcome == "verify-fail" else VERIFY_PASS}
        elif "answer" in record:
            score = {"answer": score_answer(final, record["answer"])}
        else:
            score = {}
        if score:
            row["metadata"]["score"] = score
            row["metadata"]["passed"] = all(s["passed"] for s in score.values())
        ledger.record_row(job.prompt_id, row)
    ledger.write_checkpoint()
    ledger.close()
    merge = merge_trajectories(run_dir, index_of=index_of, valid_tools=ALL_POSSIBLE_TOOLS, keep=keep)
    finish_invocation(info, duration_s=1.5, ran=len(jobs), failed=len(failed))
    stats = compute_statistics(
        run_dir,
        merge=merge,
        run_name=run_name,
        distribution=config.distribution,
        model=config.model,
        batch_size=4,
        index_of=index_of,
        duration_seconds=1.5,
        failed_prompt_ids=failed,
        valid_tools=ALL_POSSIBLE_TOOLS,
        flow_run_id=TEST_FLOW_RUN_ID,
        samples_per_prompt=SAMPLES,
    )
    write_json_atomic(run_dir / "statistics.json", stats)
    return run_dir


def rescore(run_dir: Path, prompt_id: str, prompt_index: int, score: dict[str, Any]) -> None:
    """Append a line to ``scores.jsonl`` as ``hermes-batch score`` writes it
    (:mod:`hermes_core.runfolder.rescores`)."""
    line = {
        "prompt_id": prompt_id,
        "prompt_index": prompt_index,
        "scoring_key": "test-rescore",
        "score": score,
        "usage": None,
        "timestamp": "2025-01-01T00:00:00Z",
    }
    with open(run_dir / "scores.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
