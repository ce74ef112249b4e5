"""``--compress_to_tokens``: the compress-trajectories step of the flow, end to end.

The command line as a subprocess with a real Prefect server, the mock over HTTP as the agent's model
and as the summariser (``mock/summariser?summary_words=10``: summaries of exactly 10 words), and a
word-level ``tokenizer.json`` built offline (one token per whitespace-separated word).

A mock conversation of ``[mock:turns=6]`` with terminal_only has 15 turns of these token counts:
``[954, 7, 39, 35, 40, 11, 30, 26, 32, 25, 39, 43, 40, 11, 32]`` (1,364). With a budget of 1,200,
``--protect_last_n_turns 2`` and a 16-token summary asked for, turns 0-3 (the head) and 13-14 (the
tail) stay; turns 4-11 become one summary turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from hermes_core.compression import SUMMARY_NOTICE
from hermes_core.mockllm import MockServer
from hermes_core.runfolder.spend import SpendTally
from tests.conftest import conversation_key, run_args

pytestmark = pytest.mark.slow

PROMPTS = [f"[mock:turns=6,cost=0.01] task number {i}: list the files" for i in range(3)]
SUMMARISER = "mock/summariser?summary_words=10&cost=0.01"


@pytest.fixture
def server(tmp_path):
    with MockServer() as srv:
        yield srv


def _tokenizer(folder: Path) -> Path:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(["alpha beta"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_flow_compresses_its_rows_after_the_merge_and_a_resume_pays_nothing_again(cli, server):
    dataset = cli.cwd / "long.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS), encoding="utf-8")
    options = [
        "--compress_to_tokens=1200",
        f"--tokenizer={_tokenizer(cli.cwd)}",
        f"--summary_model={SUMMARISER}",
        "--summary_target_tokens=16",
        "--protect_last_n_turns=2",
    ]
    args = run_args(dataset, "long", server, *options, model="mock/scripted?cost=0.01")
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "long"
    originals, compressed = _rows(run / "trajectories.jsonl"), _rows(run / "trajectories_compressed.jsonl")
    assert len(compressed) == 3
    for original, row in zip(originals, compressed, strict=True):
        before, after = original["conversations"], row["conversations"]
        assert [t["from"] for t in after] == ["system", "human", "gpt", "tool", "human", "gpt", "tool", "gpt"]
        assert after[0]["value"].startswith(before[0]["value"]) and SUMMARY_NOTICE in after[0]["value"]
        assert after[1:4] == before[1:4] and after[5:] == before[12:]  # the head and the tail, untouched
        prefix, summary = after[4]["value"].split(": ", 1)
        assert prefix == "[CONTEXT SUMMARY]" and len(summary.split()) == 10
        assert row["metadata"]["prompt_id"] == original["metadata"]["prompt_id"]
    metrics = json.loads((run / "compression_metrics.json").read_text())
    totals = metrics["totals"]
    assert [(r["status"], r["region"]) for r in metrics["rows"]] == [
        ("compressed", {"first": 4, "last": 11, "turns": 8})
    ] * 3
    assert {
        k: totals[k] for k in ("compressed", "untouched", "still_over", "failed", "summariser_calls")
    } == {
        "compressed": 3,
        "untouched": 0,
        "still_over": 0,
        "failed": 0,
        "summariser_calls": 3,
    }
    assert totals["tokens_before"] == 3 * 1364 and all(r["tokens_after"] <= 1200 for r in metrics["rows"])
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["compression"] == totals
    line = f"Compression: 3 compressed, 0 untouched, 0 still over, 0 failed · tokens 4092 -> {totals['tokens_after']}"
    assert line in " ".join(proc.stdout.split())
    # the summaries are 3 requests besides the agent's, and they count in the run's spend
    stats_by = server.stats()
    agent = sum(stats_by["by_conversation"][conversation_key(p)] for p in PROMPTS)
    assert stats_by["requests"] == agent + 3
    assert SpendTally.load(run).total.cost == pytest.approx(stats["cost_usd"] + 0.03)

    resumed = cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert server.stats()["requests"] == stats_by["requests"]  # no prompt and no summary again
    assert _rows(run / "trajectories_compressed.jsonl") == compressed


def test_a_tokenizer_that_does_not_load_is_refused_before_any_request(cli, server):
    dataset = cli.cwd / "one.jsonl"
    dataset.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n", encoding="utf-8")
    proc = cli(*run_args(dataset, "bad", server, "--compress_to_tokens=1200", "--tokenizer=missing.json"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --tokenizer missing.json:")
    assert server.stats()["requests"] == 0
    # no --tokenizer: the reference's default, a Hub id, which an offline machine cannot fetch
    proc = cli(*run_args(dataset, "bad", server, "--compress_to_tokens=1200"), env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --tokenizer moonshotai/Kimi-K2-Thinking: cannot fetch it")
    assert server.stats()["requests"] == 0


def test_a_pilot_projects_the_summaries_too(cli, server):
    dataset = cli.cwd / "pilot.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS), encoding="utf-8")
    options = [
        "--pilot=2",
        "--compress_to_tokens=1200",
        f"--tokenizer={_tokenizer(cli.cwd)}",
        f"--summary_model={SUMMARISER}",
        "--summary_target_tokens=16",
        "--protect_last_n_turns=2",
    ]
    proc = cli(*run_args(dataset, "pilot", server, *options, model="mock/scripted?cost=0.01"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = cli.cwd / "data" / "pilot"
    rows = _rows(run / "trajectories.jsonl")
    report = json.loads((run / "pilot.json").read_text())
    assert report["prompts_run"] == 2 and len(rows) == 2
    agent = sum(row["metadata"]["usage"]["cost"] for row in rows) / 2  # 7 requests at $0.01
    assert report["cost_per_prompt"]["mean"] == pytest.approx(agent + 0.01)  # + its summary
    assert report["projection"]["cost_usd"] == pytest.approx(3 * (agent + 0.01))
