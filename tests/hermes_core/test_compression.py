"""Compression to a token budget (hermes_core.compression, ``hermes-batch compress``).

Real parts only: a ``tokenizer.json`` built here with the ``tokenizers`` library (a word-level
model on whitespace, so a turn's tokens are its words: the expected numbers can be worked out by
hand), the mock summariser over real HTTP (``mock/summariser`` answers exactly ``summary_words``
words), real files and, for the command, real subprocesses killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from hermes_core.compression import (
    SUMMARY_NOTICE,
    SUMMARY_PREFIX,
    CompressionSettings,
    ModelSummariser,
    TokenizerError,
    compress_jsonl,
    compress_row,
    load_tokenizer,
)
from hermes_core.mockllm import MockServer
from hermes_core.settings import HermesSettings

ROOT = Path(__file__).resolve().parents[2]
NOTICE_WORDS = len(SUMMARY_NOTICE.split())
SUMMARY_TURN = 2 + 50  # "[CONTEXT" "SUMMARY]:" + the mock's 50 words


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """A word-level tokenizer.json (whitespace split), trained offline on a tiny vocabulary."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    tok.train_from_iterator(["alpha beta gamma delta <tool_call> <tool_response> ls cat"], trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def counter(tokenizer_file):
    return load_tokenizer(str(tokenizer_file))


@pytest.fixture
def server():
    with MockServer() as srv:
        yield srv


def words(n: int, word: str = "alpha") -> str:
    return " ".join([word] * n)


def long_turns(pairs: int = 10, size: int = 100, tag: str = "alpha") -> list[dict]:
    """system 10, human 10, ``pairs`` x (gpt <tool_call> ``size``, tool <tool_response> ``size``), gpt 10 (tokens)."""
    turns = [{"from": "system", "value": words(10)}, {"from": "human", "value": words(9) + f" {tag}"}]
    for i in range(pairs):
        turns.append({"from": "gpt", "value": "<tool_call> " + words(size - 2, "beta") + f" c{i}"})
        turns.append({"from": "tool", "value": "<tool_response> " + words(size - 2, "gamma") + f" r{i}"})
    turns.append({"from": "gpt", "value": words(10, "delta")})
    return turns


def row(turns: list[dict], index: int = 0) -> dict:
    return {
        "prompt_index": index,
        "conversations": turns,
        "metadata": {"prompt_id": f"p{index}"},
        "completed": True,
    }


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def settings(target: int = 1000, **kw) -> CompressionSettings:
    return CompressionSettings(
        target_max_tokens=target, summary_target_tokens=50, summary_model="mock/summariser", **kw
    )


def run(tmp_path: Path, src: Path, counter, summariser, st: CompressionSettings, workers: int = 2) -> dict:
    return compress_jsonl(
        src,
        out=tmp_path / "out.jsonl",
        cache_path=tmp_path / "compression.jsonl",
        metrics_path=tmp_path / "metrics.json",
        counter=counter,
        settings=st,
        summarise=summariser,
        workers=workers,
    )


def no_split_pair(turns: list[dict]) -> bool:
    """Every tool turn follows a gpt turn that calls a tool (or another tool turn)."""
    return all(
        t["from"] != "tool"
        or (i > 0 and (turns[i - 1]["from"] == "tool" or "<tool_call>" in turns[i - 1]["value"]))
        for i, t in enumerate(turns)
    )


def test_the_tokenizer_loads_offline_and_counts_each_turns_words(counter, tokenizer_file, tmp_path):
    assert counter.count_turns(long_turns(2)) == [10, 10, 100, 100, 100, 100, 10]
    assert (
        load_tokenizer(str(tokenizer_file.parent)).fingerprint == counter.fingerprint
    )  # a folder holding it
    with pytest.raises(TokenizerError, match=r"^--tokenizer .*missing\.json: no such file"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="the file does not load"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_a_hub_id_that_cannot_be_fetched_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network: the Hub's (empty) cache only
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(
        TokenizerError, match=r"^--tokenizer someorg/nomodel: cannot fetch it from the Hugging Face Hub"
    ):
        load_tokenizer("someorg/nomodel")


def test_a_long_row_keeps_its_head_and_tail_whole_pairs_and_ends_under_the_target(counter, server):
    turns = long_turns()  # 23 turns, 2030 tokens
    summarise = ModelSummariser("mock/summariser", server.base_url)
    result = compress_row(turns, counter, settings(1000), summarise)
    # need 2030 + 52 (summary turn) + 13 (notice) - 1000 = 1095 tokens: 11 turns from index 4 (4..14),
    # then 15 is the tool turn answering 14: the region is 4..15 (12 turns, 1200 tokens)
    assert result.status == "compressed" and result.region == (4, 16)
    new = result.conversations
    assert new[0] == {"from": "system", "value": turns[0]["value"] + SUMMARY_NOTICE}
    assert new[1:4] == turns[1:4]  # first human, first gpt, first tool
    assert new[4]["from"] == "human" and new[4]["value"].startswith(SUMMARY_PREFIX + " ")
    assert len(new[4]["value"].split()) == SUMMARY_TURN
    assert new[5:] == turns[16:] and new[-4:] == turns[-4:]  # the protected tail, untouched
    assert no_split_pair(new)
    assert result.tokens_after == sum(counter.count_turns(new)) == 2030 - 1200 + SUMMARY_TURN + NOTICE_WORDS
    assert result.tokens_after <= 1000
    assert (result.turns_before, result.turns_after, result.calls, result.errors) == (23, 12, 1, 0)
    assert server.stats()["requests"] == 1


def test_a_tail_starting_with_a_response_keeps_its_call_and_the_row_stays_over(counter, server):
    turns = long_turns()
    result = compress_row(turns, counter, settings(500), ModelSummariser("mock/summariser", server.base_url))
    # the tail (last 4) starts at 19, a tool turn: the region stops before its call (18)
    assert result.region == (4, 18) and result.status == "still_over"
    assert result.conversations[5:] == turns[18:] and no_split_pair(result.conversations)
    assert result.tokens_after == 2030 - 1400 + SUMMARY_TURN + NOTICE_WORDS > 500


def test_a_short_row_is_untouched_and_costs_nothing(counter, server, tmp_path):
    short = row(long_turns(pairs=2), 0)  # 430 tokens
    src = write_rows(tmp_path / "in.jsonl", [short])
    metrics = run(tmp_path, src, counter, ModelSummariser("mock/summariser", server.base_url), settings(1000))
    assert (tmp_path / "out.jsonl").read_bytes() == src.read_bytes()
    assert metrics["rows"][0]["status"] == "untouched" and metrics["totals"]["untouched"] == 1
    assert server.stats()["requests"] == 0


def test_a_summariser_failure_keeps_the_row_uncompressed_and_counts_it(
    counter, server, tmp_path, monkeypatch
):
    monkeypatch.setenv("HERMES_MAX_RETRIES", "1")
    src = write_rows(tmp_path / "in.jsonl", [row(long_turns(), 0)])
    failing = ModelSummariser("mock/summariser?fail_rate=1", server.base_url, HermesSettings())
    metrics = run(tmp_path, src, counter, failing, settings(1000))
    assert (tmp_path / "out.jsonl").read_bytes() == src.read_bytes()  # no placeholder summary
    per_row, totals = metrics["rows"][0], metrics["totals"]
    assert per_row["status"] == "failed" and "fail_rate" in per_row["error"]
    assert (per_row["summariser_calls"], per_row["summariser_errors"], per_row["tokens_after"]) == (
        2,
        2,
        2030,
    )
    assert (totals["failed"], totals["compressed"], totals["summariser_calls_this_run"]) == (1, 0, 2)
    assert server.stats()["by_status"] == {"500": 2}
    # the next run tries the failed row again
    metrics = run(tmp_path, src, counter, ModelSummariser("mock/summariser", server.base_url), settings(1000))
    assert metrics["rows"][0]["status"] == "compressed"


def test_the_metrics_are_exact_on_a_hand_built_case(counter, server, tmp_path):
    rows = [row(long_turns(), 0), row(long_turns(pairs=2), 1), row(long_turns(tag="beta"), 2)]
    src = write_rows(tmp_path / "in.jsonl", rows)
    summarise = ModelSummariser("mock/summariser", server.base_url)
    metrics = run(tmp_path, src, counter, summarise, settings(1000))
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["prompt_index"] for r in out] == [0, 1, 2] and out[1] == rows[1]
    after = 2030 - 1200 + SUMMARY_TURN + NOTICE_WORDS  # 895
    assert metrics["rows"][0] == {
        "line": 1,
        "prompt_index": 0,
        "prompt_id": "p0",
        "status": "compressed",
        "tokens_before": 2030,
        "tokens_after": after,
        "turns_before": 23,
        "turns_after": 12,
        "region": {"first": 4, "last": 15, "turns": 12},
        "summarised": True,
        "summariser_calls": 1,
        "summariser_errors": 0,
        # the mock counts 4 characters a token: the summary request's text and its 50-word answer
        "summariser_usage": {
            "prompt_tokens": 1839,
            "completion_tokens": 62,
            "reasoning_tokens": 0,
            "cost": None,
        },
        "cached": False,
        "error": None,
    }
    totals = metrics["totals"]
    expected = {
        "rows_in_file": 3,
        "rows": 3,
        "not_sampled": 0,
        "compressed": 2,
        "untouched": 1,
        "skipped": 1,
        "still_over": 0,
        "failed": 0,
        "dropped": 0,
        "rows_written": 3,
        "tokens_before": 2030 + 430 + 2030,
        "tokens_after": after + 430 + after,
        "tokens_saved": 2 * (2030 - after),
        "overall_ratio": round((2 * after + 430) / 4490, 4),
        "turns_before": 23 + 7 + 23,
        "turns_after": 12 + 7 + 12,
        "summarised": 2,
        "from_cache": 0,
        "summariser_calls": 2,
        "summariser_errors": 0,
        "summariser_calls_this_run": 2,
        "summariser_errors_this_run": 0,
    }
    assert {k: totals[k] for k in expected} == expected
    assert totals["averages"] == {
        "tokens_before_per_row": round(4490 / 3, 4),
        "tokens_after_per_written_row": round((2 * after + 430) / 3, 4),
        "ratio_per_summarised_row": round(after / 2030, 4),
        "tokens_saved_per_summarised_row": 2030 - after,
        "turns_removed_per_summarised_row": 11,
    }
    assert totals["duration_seconds"] >= 0
    summarised = [r["summariser_usage"] for r in metrics["rows"] if r["summariser_usage"]]
    assert totals["usage_this_run"]["completion_tokens"] == sum(u["completion_tokens"] for u in summarised)
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics


def test_still_over_rows_are_kept_or_dropped_and_a_sample_is_seeded(counter, server, tmp_path):
    rows = [row(long_turns(tag=f"t{i}"), i) for i in range(10)]
    src = write_rows(tmp_path / "in.jsonl", rows)
    summarise = ModelSummariser("mock/summariser", server.base_url)
    kept = run(tmp_path, src, counter, summarise, settings(500))
    assert kept["totals"]["still_over"] == 10 and kept["totals"]["rows_written"] == 10
    dropped = run(tmp_path, src, counter, summarise, settings(500, drop_over_limit=True))
    assert dropped["totals"]["dropped"] == 10 and (tmp_path / "out.jsonl").read_bytes() == b""
    assert server.stats()["requests"] == 10  # dropping re-uses the cached summaries
    sampled = run(tmp_path, src, counter, summarise, settings(1000, sample_percent=30, seed=7))
    lines = [r["line"] for r in sampled["rows"]]
    assert len(lines) == 3 and lines == sorted(lines) and sampled["totals"]["not_sampled"] == 7
    again = run(tmp_path, src, counter, summarise, settings(1000, sample_percent=30, seed=7))
    assert [r["line"] for r in again["rows"]] == lines and again["totals"]["summariser_calls_this_run"] == 0


def test_a_change_of_target_recompresses_only_the_rows_it_affects(counter, server, tmp_path):
    rows = [row(long_turns(), 0), row(long_turns(pairs=2), 1), row(long_turns(pairs=7), 2)]  # 2030, 430, 1430
    src = write_rows(tmp_path / "in.jsonl", rows)
    summarise = ModelSummariser("mock/summariser", server.base_url)
    first = run(tmp_path, src, counter, summarise, settings(1000))
    assert [r["status"] for r in first["rows"]] == ["compressed", "untouched", "compressed"]
    assert server.stats()["requests"] == 2
    second = run(tmp_path, src, counter, summarise, settings(1500))
    # row 2 (1430) is under the new target: untouched, no request; row 0 is over both: summarised again
    assert [r["status"] for r in second["rows"]] == ["compressed", "untouched", "untouched"]
    assert second["totals"]["summariser_calls_this_run"] == 1 and server.stats()["requests"] == 3
    back = run(tmp_path, src, counter, summarise, settings(1000))
    assert back["totals"]["summariser_calls_this_run"] == 0 and back["totals"]["from_cache"] == 2
    assert [r["tokens_after"] for r in back["rows"]] == [r["tokens_after"] for r in first["rows"]]
    assert server.stats()["requests"] == 3


# --- the command, end to end ------------------------------------------------------------------------------


def _run_folder(tmp_path: Path, n: int) -> Path:
    """A run folder written by the product's code (tests/run_folders.py) whose trajectories.jsonl then gets
    ``n`` long rows: each real row with its call/response pair repeated 10 times, longer."""
    from tests.run_folders import build_run

    run_dir = build_run(tmp_path, [("kept", "List the files in the working directory")], run_name="long")
    real = json.loads((run_dir / "trajectories.jsonl").read_text().splitlines()[0])
    system, human, call, response, final = real["conversations"]
    rows = []
    for i in range(n):
        turns = [system, {**human, "value": f"{human['value']} {i}"}]
        for k in range(10):
            turns += [
                {**call, "value": call["value"] + " " + words(100, "beta") + f" {k}"},
                {**response, "value": response["value"] + " " + words(100, "gamma")},
            ]
        rows.append({**real, "prompt_index": i, "conversations": [*turns, final]})
    write_rows(run_dir / "trajectories.jsonl", rows)
    return run_dir


def _compress(run_dir: Path, tokenizer: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "compress", str(run_dir), f"--tokenizer={tokenizer}", *extra]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.slow
def test_the_compress_command_end_to_end_killed_and_run_again(counter, tokenizer_file, server, tmp_path):
    run_dir = _run_folder(tmp_path, 6)
    base = _compress(run_dir, tokenizer_file, "--target_max_tokens=1500", "--summary_target_tokens=50")
    slow = [*base, f"--summary_base_url={server.base_url}", "--summary_model=mock/summariser?latency_ms=400"]
    proc = subprocess.Popen(
        [*slow, "--num_workers=1"], cwd=ROOT, env=_env(), stderr=subprocess.PIPE, text=True
    )
    cache = run_dir / "compression.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not cache.exists() or cache.read_text().count('"calls": 1') < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    paid = cache.read_text().count('"calls": 1')
    assert 2 <= paid < 6 and not (run_dir / "trajectories_compressed.jsonl").exists()
    with open(cache, "ab") as fh:  # a torn last line, as a kill in the middle of a write leaves
        fh.write(b'{"row": "abc", "tokeni')
    before = server.stats()["requests"]
    done = subprocess.run([*slow, "--num_workers=3"], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert server.stats()["requests"] - before == 6 - paid  # nothing paid twice
    assert "Compressed 6 row(s)" in done.stdout and f"{paid} row(s) from the cache" in done.stdout
    out = [json.loads(line) for line in (run_dir / "trajectories_compressed.jsonl").read_text().splitlines()]
    assert [r["prompt_index"] for r in out] == list(range(6))
    for r in out:
        assert r["conversations"][4]["value"].startswith(SUMMARY_PREFIX) and no_split_pair(r["conversations"])
        assert sum(counter.count_turns(r["conversations"])) <= 1500
    metrics = json.loads((run_dir / "compression_metrics.json").read_text())
    assert metrics["totals"]["compressed"] == 6 and metrics["totals"]["from_cache"] == paid
    assert metrics["settings"]["summary_model"] == "mock/summariser?latency_ms=400"


@pytest.mark.slow
def test_the_compress_command_refuses_bad_input_with_one_line(tokenizer_file, server, tmp_path):
    run_dir = _run_folder(tmp_path, 1)
    cases = [
        (_compress(run_dir, tmp_path / "nope.json"), "error: --tokenizer "),
        (_compress(run_dir, tokenizer_file, "--sample_percent=0"), "error: --sample_percent 0: must be"),
        (_compress(tmp_path / "nothing", tokenizer_file), "error: "),
        (_compress(tmp_path, tokenizer_file), "error: "),  # a folder that is not a run folder
    ]
    for argv, message in cases:
        done = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True)
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    failing = _compress(
        run_dir, tokenizer_file, "--target_max_tokens=1500", "--summary_target_tokens=50",
        f"--summary_base_url={server.base_url}", "--summary_model=mock/summariser?fail_rate=1",
    )  # fmt: skip
    done = subprocess.run(failing, cwd=ROOT, env=_env(HERMES_MAX_RETRIES="0"), capture_output=True, text=True)
    assert done.returncode == 1 and "1 row(s) could not be summarised" in done.stderr
    assert (run_dir / "trajectories_compressed.jsonl").read_bytes() == (
        run_dir / "trajectories.jsonl"
    ).read_bytes()
