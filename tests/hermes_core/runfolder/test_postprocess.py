"""Tests of hermes_core.runfolder.postprocess (merge + statistics) and hermes_core.runfolder.files on hand-made run folders."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from hermes_core.runfolder.files import append_jsonl, repair_torn_tail
from hermes_core.runfolder.postprocess import (
    MergeResult,
    compute_statistics,
    merge_trajectories,
    write_json_atomic,
)

TOOLS = ["read_file", "terminal", "web_search"]


def _row(index, pid, *, stats=None, usage=None, reasoning=(1, 1), conv="hi", batch=0):
    tool_stats = {t: {"count": 0, "success": 0, "failure": 0} for t in TOOLS}
    tool_stats.update(stats or {})
    return {
        "prompt_index": index,
        "conversations": [{"from": "human", "value": conv}, {"from": "gpt", "value": "ok"}],
        "metadata": {
            "batch_num": batch,
            "timestamp": "2026-01-15T10:30:00",
            "model": "mock/m",
            "prompt_id": pid,
            "usage": usage
            if usage is not None
            else {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cost": None},
            "reasoning": {"assistant_turns": reasoning[0], "turns_with_reasoning": reasoning[1]},
        },
        "completed": True,
        "partial": False,
        "api_calls": reasoning[0],
        "toolsets_used": [],
        "tool_stats": dict(sorted(tool_stats.items())),
        "tool_error_counts": {t: 0 for t in sorted(tool_stats)},
    }


def _line(obj) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


def _write(run_dir: Path, name: str, *parts: dict | bytes) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / name).write_bytes(b"".join(p if isinstance(p, bytes) else _line(p) for p in parts))


def _merged(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()]


def _merge_result(**kw) -> MergeResult:
    return MergeResult(**{"rows_written": 0, "duplicates_dropped": 0, "filtered_hallucinated": 0,
                          "orphaned": 0, "torn_lines": 0, "path": Path("/nonexistent"), **kw})  # fmt: skip


def test_merge_orders_dedups_skips_torn_and_filters(tmp_path):
    run = tmp_path / "run"
    r3 = _row(3, "p3", conv="三 ünïcode")
    _write(run, "batch_0.jsonl", _row(2, "p2"), r3)
    _write(
        run, "batch_1.jsonl", _row(0, "p0"), _row(3, "p3", conv="later copy"), b'{"prompt_index": 9, "conv'
    )
    _write(
        run, "batch_10.jsonl", _row(1, "p1", stats={"made_up_tool": {"count": 1, "success": 1, "failure": 0}})
    )
    _write(run, "batch_2.jsonl", b"\n", _row(4, "p4"), b"   \n")
    _write(run, "notes.jsonl", _row(7, "p7"))  # not a batch file

    result = merge_trajectories(run, index_of=None, valid_tools=TOOLS)

    assert result == MergeResult(
        rows_written=4,
        duplicates_dropped=1,
        filtered_hallucinated=1,
        orphaned=0,
        torn_lines=1,
        path=run / "trajectories.jsonl",
    )
    rows = _merged(run)
    assert [(r["prompt_index"], r["metadata"]["prompt_id"]) for r in rows] == [
        (0, "p0"),
        (2, "p2"),
        (3, "p3"),
        (4, "p4"),
    ]
    assert rows[2]["conversations"][0]["value"] == "三 ünïcode"  # first occurrence kept (batch 0)
    # rows are copied byte-for-byte
    lines = (run / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    assert lines[2] == _line(r3)
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def test_merge_keeps_bytes_exactly_and_normalises_crlf(tmp_path):
    run = tmp_path / "run"
    compact = b'{"prompt_index":1,"metadata":{"prompt_id":"b"},"tool_stats":{"terminal":{"count":1,"success":1,"failure":0}}}'
    spaced = b'{"prompt_index": 0,   "metadata": {"prompt_id": "a"}, "x": "\\u00e9"}'
    _write(run, "batch_0.jsonl", compact + b"\r\n" + spaced)  # no final newline, valid JSON: kept
    result = merge_trajectories(run, index_of=None, valid_tools=TOOLS)
    assert (result.rows_written, result.torn_lines) == (2, 0)
    assert (run / "trajectories.jsonl").read_bytes() == spaced + b"\n" + compact + b"\n"


def test_merge_remaps_indices_and_counts_orphans(tmp_path):
    run = tmp_path / "run"
    original = _row(0, "a", conv="é")
    _write(run, "batch_0.jsonl", original, _row(1, "b"), _row(2, "gone"))
    _write(run, "batch_1.jsonl", _row(5, "c"), _row(3, "gone"), _row(0, "a"))
    index_of = {"a": 2, "b": 1, "c": 0, "never_ran": 3}

    result = merge_trajectories(run, index_of=index_of, valid_tools=TOOLS, out_name="merged.jsonl")

    assert (result.rows_written, result.orphaned, result.duplicates_dropped) == (3, 2, 1)
    assert result.path == run / "merged.jsonl"
    lines = result.path.read_bytes().splitlines(keepends=True)
    rows = [json.loads(x) for x in lines]
    assert [(r["prompt_index"], r["metadata"]["prompt_id"]) for r in rows] == [(0, "c"), (1, "b"), (2, "a")]
    # unchanged index: byte-for-byte; changed index: json.dumps with key order kept
    assert lines[1] == _line(_row(1, "b"))
    assert lines[2] == _line({**original, "prompt_index": 2})
    assert list(rows[2]) == list(original)


def test_merge_empty_run_and_replaces_existing_output(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trajectories.jsonl").write_text("stale\n")
    result = merge_trajectories(run, index_of={}, valid_tools=TOOLS)
    assert result.rows_written == 0
    assert (run / "trajectories.jsonl").read_bytes() == b""


def test_merge_many_batch_files_beyond_open_handle_pool(tmp_path):
    run = tmp_path / "run"
    # 50 batch files with interleaved indices force the handle pool to evict and reopen
    for n in range(50):
        _write(run, f"batch_{n}.jsonl", _row(n, f"p{n}"), _row(100 - n, f"q{n}"))
    result = merge_trajectories(run, index_of=None, valid_tools=TOOLS)
    assert result.rows_written == 100
    assert [r["prompt_index"] for r in _merged(run)] == sorted(list(range(50)) + [100 - n for n in range(50)])


def _stat_run(tmp_path: Path) -> tuple[Path, MergeResult]:
    run = tmp_path / "run"
    _write(
        run,
        "batch_0.jsonl",
        _row(
            0,
            "p0",
            stats={
                "terminal": {"count": 3, "success": 2, "failure": 1},
                "read_file": {"count": 1, "success": 1, "failure": 0},
            },
            usage={"prompt_tokens": 100, "completion_tokens": 40, "reasoning_tokens": 10, "cost": 0.25},
            reasoning=(4, 3),
        ),
        _row(
            1,
            "p1",
            stats={"terminal": {"count": 3, "success": 0, "failure": 3}},
            usage={"prompt_tokens": 50, "completion_tokens": 5, "reasoning_tokens": 0, "cost": None},
            reasoning=(2, 2),
        ),
    )
    _write(
        run,
        "batch_1.jsonl",
        _row(
            2,
            "p2",
            stats={
                "web_search": {"count": 1, "success": 1, "failure": 0},
                "fake": {"count": 1, "success": 0, "failure": 1},
            },
            reasoning=(9, 9),
        ),
        _row(
            3,
            "p3",
            usage={"prompt_tokens": 7, "completion_tokens": 3, "reasoning_tokens": 1, "cost": 0.5},
            reasoning=(3, 1),
        ),
    )
    tomb = {"prompt_index": 9, "assistant_turns": 2, "time": "2026-01-15T10:30:00"}
    tomb_usage = {"prompt_tokens": 20, "completion_tokens": 6, "reasoning_tokens": 0, "cost": 0.125}
    _write(
        run,
        "discarded.jsonl",
        {"prompt_id": "d1", **tomb, "usage": tomb_usage},
        {
            "prompt_id": "d2",
            **tomb,
            "assistant_turns": 1,
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "reasoning_tokens": 0, "cost": None},
        },
        {"prompt_id": "d1", **tomb, "usage": tomb_usage},  # duplicate tombstone: counted once
        {"prompt_id": "gone", **tomb, "usage": tomb_usage},  # not in the current dataset: not counted
        b'{"prompt_id": "d3", "assis',  # torn
    )
    return run, merge_trajectories(run, index_of=None, valid_tools=TOOLS)


DATASET_OF_TEN = {pid: i for i, pid in enumerate(["p0", "p1", "p2", "p3", "d1", "d2", "d3", "f1", "f2", "x"])}


def test_statistics_exact_numbers(tmp_path):
    run, merge = _stat_run(tmp_path)
    assert (merge.rows_written, merge.filtered_hallucinated) == (3, 1)
    stats = compute_statistics(
        run,
        merge=merge,
        run_name="r1",
        distribution="default",
        model="mock/m",
        batch_size=2,
        index_of=DATASET_OF_TEN,
        duration_seconds=12.3456,
        failed_prompt_ids=["f1", "f2"],
        valid_tools=["web_search", "terminal", "read_file", "vision_analyze"],
        flow_run_id="fr-1",
    )
    completed_at = stats.pop("completed_at")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", completed_at)
    assert (
        abs(
            (
                datetime.fromisoformat(completed_at)
                - datetime.now(datetime.fromisoformat(completed_at).tzinfo)
            ).total_seconds()
        )
        < 60
    )
    assert stats == {
        "run_name": "r1",
        "distribution": "default",
        "total_prompts": 10,
        "total_batches": 2,
        "batch_size": 2,
        "model": "mock/m",
        "duration_seconds": 12.35,
        "tool_statistics": {
            "read_file": {"count": 1, "success": 1, "failure": 0, "success_rate": 100.0, "failure_rate": 0.0},
            "terminal": {
                "count": 6,
                "success": 2,
                "failure": 4,
                "success_rate": 33.33,
                "failure_rate": 66.67,
            },
            "vision_analyze": {
                "count": 0,
                "success": 0,
                "failure": 0,
                "success_rate": 0.0,
                "failure_rate": 0.0,
            },
            "web_search": {"count": 0, "success": 0, "failure": 0, "success_rate": 0.0, "failure_rate": 0.0},
        },
        # kept rows: 4+2+3 = 9 turns, 3+2+1 = 6 with reasoning; tombstones d1, d2: 2+1 turns without
        "reasoning_statistics": {
            "total_assistant_turns": 12,
            "turns_with_reasoning": 6,
            "turns_without_reasoning": 6,
            "coverage_percent": 50.0,
        },
        "discarded_no_reasoning": 2,
        "completed": 3,
        "failed": 2,
        "filtered_hallucinated": 1,
        # rows 100+50+7 and 40+5+3, tombstones 20+1 and 6+1
        "tokens": {"prompt": 178, "completion": 55, "reasoning": 11, "total": 233},
        "cost_usd": 0.875,
        "scores": {},  # no row was scored
        "kept_by_filter": {"keep": "all", "kept": 3, "rejected": 0},
        "pass_at_k": {},
        "pass_hat_k": None,
        "merge": {"duplicates_dropped": 0, "orphaned": 0, "torn_lines": 0},
        "flow_run_id": "fr-1",
    }
    keys = list(compute_statistics(run, merge=merge, run_name="r", distribution="d", model="m", batch_size=1,
                                   index_of={}, duration_seconds=0, failed_prompt_ids=[], valid_tools=TOOLS))  # fmt: skip
    assert keys == [
        "run_name", "distribution", "total_prompts", "total_batches", "batch_size", "model", "completed_at",
        "duration_seconds", "tool_statistics", "reasoning_statistics", "discarded_no_reasoning", "completed",
        "failed", "filtered_hallucinated", "tokens", "cost_usd", "scores", "kept_by_filter", "pass_at_k",
        "pass_hat_k", "merge",
        "flow_run_id",
    ]  # fmt: skip


def test_statistics_cost_null_and_empty_run(tmp_path):
    run = tmp_path / "run"
    _write(run, "batch_0.jsonl", _row(0, "a", reasoning=(3, 2)), _row(1, "b", reasoning=(0, 0)))
    merge = merge_trajectories(run, index_of=None, valid_tools=TOOLS)
    args = dict(run_name="r", distribution="d", model="m", batch_size=5, index_of={"a": 0, "b": 1}, duration_seconds=1,
                failed_prompt_ids=set(), valid_tools=TOOLS)  # fmt: skip
    stats = compute_statistics(run, merge=merge, **args)
    assert stats["cost_usd"] is None
    assert stats["tokens"] == {"prompt": 0, "completion": 0, "reasoning": 0, "total": 0}
    assert stats["reasoning_statistics"] == {
        "total_assistant_turns": 3,
        "turns_with_reasoning": 2,
        "turns_without_reasoning": 1,
        "coverage_percent": 66.67,
    }
    assert stats["discarded_no_reasoning"] == 0

    empty = tmp_path / "empty"
    empty.mkdir()
    merge = merge_trajectories(empty, index_of=None, valid_tools=TOOLS)
    stats = compute_statistics(empty, merge=merge, **args)
    assert stats["completed"] == 0 and stats["total_batches"] == 0 and stats["cost_usd"] is None
    assert stats["reasoning_statistics"]["coverage_percent"] == 0.0
    assert stats["tool_statistics"]["terminal"] == {
        "count": 0, "success": 0, "failure": 0, "success_rate": 0.0, "failure_rate": 0.0,
    }  # fmt: skip


def test_statistics_rows_missing_optional_fields(tmp_path):
    run = tmp_path / "run [1]*"  # glob characters in the path
    bare = {
        "prompt_index": 0,
        "metadata": {"prompt_id": "x"},
        "tool_stats": {"terminal": {"count": 2, "success": 1, "failure": 1}},
    }
    _write(
        run,
        "batch_0.jsonl",
        bare,
        _row(1, "y", usage={"prompt_tokens": 3, "completion_tokens": 2, "reasoning_tokens": None, "cost": 0}),
    )
    merge = merge_trajectories(run, index_of=None, valid_tools=TOOLS)
    stats = compute_statistics(run, merge=merge, run_name="r", distribution="d", model="m", batch_size=1,
                               index_of={"x": 0, "y": 1}, duration_seconds=0, failed_prompt_ids=[], valid_tools=TOOLS)  # fmt: skip
    assert stats["completed"] == 2
    assert stats["tool_statistics"]["terminal"]["success_rate"] == 50.0
    assert stats["tokens"] == {"prompt": 3, "completion": 2, "reasoning": 0, "total": 5}
    assert stats["cost_usd"] == 0.0  # a reported zero cost is not "no cost"
    assert stats["reasoning_statistics"]["total_assistant_turns"] == 1


def test_write_json_atomic(tmp_path):
    target = tmp_path / "checkpoint.json"
    write_json_atomic(target, {"run_name": "é", "completed_prompts": [1, 2]})
    assert (
        target.read_text(encoding="utf-8")
        == '{\n  "run_name": "é",\n  "completed_prompts": [\n    1,\n    2\n  ]\n}\n'
    )
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_text(encoding="utf-8"))["run_name"] == "é"  # old content untouched
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_append_jsonl_and_repair_torn_tail(tmp_path):
    path = tmp_path / "batch_0.jsonl"
    assert repair_torn_tail(path) == 0  # missing file
    with open(path, "ab") as fh:
        append_jsonl(fh, {"prompt_id": "a", "v": "é"})
    assert path.read_bytes() == '{"prompt_id": "a", "v": "é"}\n'.encode()
    assert repair_torn_tail(path) == 0
    with open(path, "ab") as fh:
        fh.write(b'{"prompt_id": "b", "v')
    assert repair_torn_tail(path) == len(b'{"prompt_id": "b", "v')
    assert path.read_bytes() == '{"prompt_id": "a", "v": "é"}\n'.encode()
    with open(path, "ab") as fh:
        fh.write(b'{"prompt_id": "c"}')  # complete JSON, only the newline missing: kept
    assert repair_torn_tail(path) == 0
    assert path.read_bytes().endswith(b'{"prompt_id": "c"}\n')


def test_unchanged_merge_and_statistics_are_not_done_again(tmp_path, monkeypatch):
    """A resume of a finished run: same batch files, same dataset -> the merge and row sums are remembered."""
    import hermes_core.runfolder.postprocess as pp

    run = tmp_path / "run"
    _write(run, "batch_0.jsonl", _row(1, "b", usage={"prompt_tokens": 3}), _row(0, "a"))
    index_of = {"a": 0, "b": 1}
    first = merge_trajectories(run, index_of=index_of, valid_tools=TOOLS)
    stats = dict(_stats_of(run, first, index_of), completed_at=None)
    merged = (run / "trajectories.jsonl").read_bytes()

    def must_not_read(*a, **kw):
        raise AssertionError("read again")

    with monkeypatch.context() as m:
        m.setattr(pp, "iter_raw_lines", must_not_read)
        m.setattr(pp, "_row_sums", must_not_read)
        again = merge_trajectories(run, index_of=index_of, valid_tools=TOOLS)
        assert again == first
        assert dict(_stats_of(run, again, index_of), completed_at=None) == stats
    assert (run / "trajectories.jsonl").read_bytes() == merged
    # another index_of, a changed batch file or a changed merged file: done again
    assert merge_trajectories(run, index_of={"a": 0}, valid_tools=TOOLS).rows_written == 1
    merge_trajectories(run, index_of=index_of, valid_tools=TOOLS)
    with open(run / "batch_0.jsonl", "ab") as fh:
        fh.write(_line(_row(2, "c")))
    third = merge_trajectories(run, index_of={**index_of, "c": 2}, valid_tools=TOOLS)
    assert third.rows_written == 3 and _stats_of(run, third, {**index_of, "c": 2})["completed"] == 3
    (run / "trajectories.jsonl").write_bytes(b"")
    assert merge_trajectories(run, index_of={**index_of, "c": 2}, valid_tools=TOOLS).rows_written == 3
    assert len(_merged(run)) == 3


def _stats_of(run: Path, merge: MergeResult, index_of: dict) -> dict:
    return compute_statistics(
        run,
        merge=merge,
        run_name="r",
        distribution="d",
        model="m",
        batch_size=10,
        index_of=index_of,
        duration_seconds=1.0,
        failed_prompt_ids=[],
        valid_tools=TOOLS,
    )


def _scored(index, pid, value: float | None, api_calls: int, tokens: int = 10) -> dict:
    """A row of prompt ``index`` scored ``value`` by the answer scorer (None: not scored)."""
    row = _row(
        index,
        pid,
        usage={"prompt_tokens": tokens, "completion_tokens": 1, "reasoning_tokens": 0, "cost": None},
    )
    row["api_calls"] = api_calls
    if value is not None:
        row["metadata"]["score"] = {"answer": {"value": value, "passed": value == 1.0, "explanation": "x"}}
        row["metadata"]["passed"] = value == 1.0
    return row


def test_keep_passed_and_best_send_the_others_to_rejected_and_statistics_count_both(tmp_path):
    run = tmp_path / "run"
    rows = [
        _scored(0, "a0", 0.0, 2),
        _scored(0, "a1", 1.0, 5),
        _scored(0, "a2", 1.0, 3),  # best of record 0: passed, fewer model calls than a1
        _scored(1, "b0", 0.0, 4),
        _scored(1, "b1", None, 1),  # best of record 1: not scored counts as 0.0, and fewer model calls
        _scored(2, "c0", None, 2),  # record 2: not scored
    ]
    _write(run, "batch_0.jsonl", *rows[:3])
    _write(run, "batch_1.jsonl", *rows[3:])
    index_of = {"a0": 0, "a1": 0, "a2": 0, "b0": 1, "b1": 1, "c0": 2}

    def pids(path):
        return [r["metadata"]["prompt_id"] for r in (json.loads(x) for x in path.read_text().splitlines())]

    def statistics(merge):
        return compute_statistics(run, merge=merge, run_name="r", distribution="d", model="m", batch_size=3,
                                  index_of=index_of, duration_seconds=1, failed_prompt_ids=[], valid_tools=TOOLS)  # fmt: skip

    passed = merge_trajectories(run, index_of=index_of, valid_tools=TOOLS, keep="passed")
    assert (passed.keep, passed.rows_written, passed.rejected) == ("passed", 2, 4)
    assert pids(run / "trajectories.jsonl") == ["a1", "a2"]
    assert pids(run / "rejected.jsonl") == ["a0", "b0", "b1", "c0"]  # in prompt order, as the merge's
    stats = statistics(passed)
    assert stats["completed"] == 2
    assert stats["kept_by_filter"] == {"keep": "passed", "kept": 2, "rejected": 4}
    assert stats["tokens"]["prompt"] == 60  # the rejected samples were paid for: 6 rows x 10
    assert stats["scores"] == {"answer": {"scored": 4, "passed": 2, "failed": 2, "errored": 0, "mean": 0.5}}

    best = merge_trajectories(run, index_of=index_of, valid_tools=TOOLS, keep="best")
    assert pids(run / "trajectories.jsonl") == ["a2", "b1", "c0"]
    assert pids(run / "rejected.jsonl") == ["a0", "a1", "b0"]
    assert statistics(best)["kept_by_filter"] == {"keep": "best", "kept": 3, "rejected": 3}

    every = merge_trajectories(run, index_of=index_of, valid_tools=TOOLS, keep="all")
    assert (every.rows_written, every.rejected) == (6, 0)
    assert not (run / "rejected.jsonl").exists()  # the earlier filter's rejects are not left behind
    assert statistics(every)["scores"] == stats["scores"]
    with pytest.raises(ValueError, match="keep must be one of all, passed, best"):
        merge_trajectories(run, index_of=index_of, valid_tools=TOOLS, keep="some")
