"""The run ledger: durable, idempotent writes; batch numbering; checkpoint; torn-line repair; run lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hermes_core.runfolder.folder import LEDGER_INDEX_FILE as INDEX_FILE
from hermes_core.runfolder.ledger import RunInUseError, RunLedger, RunLock


def _row(pid: str, index: int) -> dict:
    return {
        "prompt_index": index,
        "conversations": [{"from": "human", "value": f"p{index}"}],
        "metadata": {"batch_num": None, "prompt_id": pid},
        "completed": True,
    }


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_rows_go_to_planned_batches_and_checkpoint_follows(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "hermes_core.runfolder.ledger.CHECKPOINT_INTERVAL", 0.0
    )  # a checkpoint at every finished batch
    monkeypatch.setattr("hermes_core.runfolder.ledger.CHECKPOINT_COST_MULTIPLE", 0.0)
    ledger = RunLedger.open(tmp_path, "r")
    index_of = {f"id{i}": i for i in range(5)}
    plan = ledger.plan([(i, f"id{i}") for i in range(5)], batch_size=2, index_of=index_of)
    assert plan == {"id0": 0, "id1": 0, "id2": 1, "id3": 1, "id4": 2}
    assert ledger.record_row("id1", _row("id1", 1))
    assert not (tmp_path / "checkpoint.json").exists()  # batch 0 not complete yet
    assert ledger.record_discard("id0", {"prompt_index": 0, "assistant_turns": 2})
    checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    assert checkpoint["completed_prompts"] == [0, 1]
    assert checkpoint["batch_stats"] == {"0": {"processed": 1, "skipped": 0, "discarded_no_reasoning": 1}}
    ledger.record_failure("id2", 2, "ModelError", "HTTP 500", attempts=2)
    ledger.record_row("id3", _row("id3", 3))
    checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    assert checkpoint["batch_stats"]["1"] == {"processed": 1, "skipped": 1, "discarded_no_reasoning": 0}
    assert checkpoint["completed_prompts"] == [0, 1, 3]
    ledger.close()
    assert [r["metadata"]["batch_num"] for r in _lines(tmp_path / "batch_0.jsonl")] == [0]
    assert _lines(tmp_path / "failures.jsonl")[0]["error_type"] == "ModelError"
    assert oct(os.stat(tmp_path / "checkpoint.json").st_mode & 0o777) != "0o600"


def test_writes_are_idempotent_by_prompt_identity(tmp_path):
    ledger = RunLedger.open(tmp_path, "r")
    ledger.plan([(0, "a")], batch_size=5, index_of={"a": 0})
    assert ledger.record_row("a", _row("a", 0)) is True
    assert ledger.record_row("a", _row("a", 0)) is False
    assert ledger.record_discard("a", {"prompt_index": 0}) is False
    ledger.close()
    assert len(_lines(tmp_path / "batch_0.jsonl")) == 1


def test_reopen_finds_finished_prompts_and_numbers_new_batches_after_old_ones(tmp_path):
    ledger = RunLedger.open(tmp_path, "r")
    ledger.plan([(0, "a"), (1, "b"), (2, "c")], batch_size=2, index_of={"a": 0, "b": 1, "c": 2})
    ledger.record_row("a", _row("a", 0))
    ledger.record_discard("c", {"prompt_index": 2})
    ledger.close()
    again = RunLedger.open(tmp_path, "r")
    assert again.finished == {"a", "c"}
    assert again.next_batch == 2  # after batch_0.jsonl and batch 1 of the checkpoint's batch_stats
    plan = again.plan([(1, "b")], batch_size=2, index_of={"a": 0, "b": 1, "c": 2})
    assert plan == {"b": 2}
    again.record_row("b", _row("b", 1))
    again.close()
    assert len(_lines(tmp_path / "batch_0.jsonl")) == 1  # the old file is never appended to


def test_torn_last_line_is_repaired_on_open(tmp_path):
    good = json.dumps(_row("a", 0))
    (tmp_path / "batch_0.jsonl").write_text(good + "\n" + good[:40], encoding="utf-8")
    ledger = RunLedger.open(tmp_path, "r")
    assert ledger.torn_bytes == 40
    assert ledger.finished == {"a"}
    assert (tmp_path / "batch_0.jsonl").read_text(encoding="utf-8") == good + "\n"


def test_prompt_id_inside_conversation_text_is_not_mistaken_for_a_row(tmp_path):
    row = _row("real", 0)
    row["conversations"][0]["value"] = 'see {"prompt_id": "fake"} and , "prompt_id": "fake2"'
    (tmp_path / "batch_0.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    assert RunLedger.open(tmp_path, "r").finished == {"real"}


def test_run_lock_refuses_a_second_process(tmp_path):
    with RunLock(tmp_path):
        code = (
            "import sys; from pathlib import Path; from hermes_core.runfolder.ledger import RunLock, RunInUseError\n"
            f"try:\n    RunLock(Path({str(tmp_path)!r})).__enter__()\nexcept RunInUseError as e:\n"
            "    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert proc.returncode == 3 and f"pid {os.getpid()}" in proc.stdout
    with RunLock(tmp_path):  # released: can be taken again
        pass
    with pytest.raises(RunInUseError):
        with RunLock(tmp_path):
            with RunLock(tmp_path):
                pass


def test_batches_of_a_killed_invocation_get_their_stats_back(tmp_path):
    ledger = RunLedger.open(tmp_path, "r")
    index_of = {f"id{i}": i for i in range(4)}
    ledger.plan([(i, f"id{i}") for i in range(4)], batch_size=4, index_of=index_of)
    ledger.record_row("id0", _row("id0", 0))
    ledger.record_discard("id1", {"prompt_index": 1, "assistant_turns": 1})
    ledger.close()  # killed here: batch 0 never complete, no checkpoint written
    assert not (tmp_path / "checkpoint.json").exists()
    again = RunLedger.open(tmp_path, "r")
    assert again.batch_stats == {"0": {"processed": 1, "skipped": 0, "discarded_no_reasoning": 1}}
    again.plan([(2, "id2"), (3, "id3")], batch_size=4, index_of=index_of)
    again.record_row("id2", _row("id2", 2))
    again.record_row("id3", _row("id3", 3))
    checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    assert checkpoint["batch_stats"] == {
        "0": {"processed": 1, "skipped": 0, "discarded_no_reasoning": 1},
        "1": {"processed": 2, "skipped": 0, "discarded_no_reasoning": 0},
    }
    assert checkpoint["completed_prompts"] == [0, 1, 2, 3]


def test_a_killed_invocation_counts_in_the_run_duration(tmp_path):
    import time as _time

    from hermes_core.dataset import read_dataset
    from hermes_core.runfolder.run_info import finish_invocation, start_invocation

    dataset_file = tmp_path / "d.jsonl"
    dataset_file.write_text('{"prompt": "a"}\n')
    dataset = read_dataset(dataset_file)
    run = tmp_path / "run"
    run.mkdir()
    first = start_invocation(run, "r", {}, "h", dataset, "fr-1")
    _time.sleep(2.1)
    (run / "batch_0.jsonl").write_text('{"metadata": {"prompt_id": "x"}}\n')  # its last row, then killed
    second = start_invocation(run, "r", {}, "h", dataset, "fr-2")
    killed = second.data["invocations"][0]
    assert killed["killed"] is True and 1.5 <= killed["duration_s"] <= 4
    assert second.run_id == first.run_id  # the same run folder keeps its identity
    finish_invocation(second, duration_s=1.0)
    assert 2.5 <= second.total_duration <= 5


def test_checkpoint_is_written_at_most_every_interval_and_at_close(tmp_path, monkeypatch):
    monkeypatch.setattr("hermes_core.runfolder.ledger.CHECKPOINT_INTERVAL", 3600.0)
    ledger = RunLedger.open(tmp_path, "r")
    ledger.plan([(i, f"id{i}") for i in range(4)], batch_size=1, index_of={f"id{i}": i for i in range(4)})
    ledger.record_row("id0", _row("id0", 0))  # the first finished batch writes one
    assert json.loads((tmp_path / "checkpoint.json").read_text())["completed_prompts"] == [0]
    ledger.record_row("id1", _row("id1", 1))
    ledger.record_row("id2", _row("id2", 2))
    assert json.loads((tmp_path / "checkpoint.json").read_text())["completed_prompts"] == [0]
    ledger.write_checkpoint()  # what the flow does when its prompts are done
    ledger.close()
    assert json.loads((tmp_path / "checkpoint.json").read_text())["completed_prompts"] == [0, 1, 2]


def test_reopen_reads_the_index_not_the_rows_and_rescans_a_changed_file(tmp_path):
    """The code path of a resume of 10^6 prompts at small scale: closed batch files are indexed."""
    ledger = RunLedger.open(tmp_path, "r")
    ledger.plan([(i, f"id{i}") for i in range(5)], batch_size=2, index_of={f"id{i}": i for i in range(5)})
    for i in range(4):
        ledger.record_row(f"id{i}", _row(f"id{i}", i))
    ledger.record_row("id4", _row("id4", 4))
    ledger.write_checkpoint()  # as the flow does at its end (spend.json then covers every file)
    ledger.close()  # batch 2 (id4) is closed here, the others when they finished
    index = _lines(tmp_path / INDEX_FILE)
    assert [(e["file"], e["ids"]) for e in index] == [
        ("batch_0.jsonl", ["id0", "id1"]),
        ("batch_1.jsonl", ["id2", "id3"]),
        ("batch_2.jsonl", ["id4"]),
    ]
    # the index is what a reopen reads: a row the index does not list is not seen while it matches...
    reads = []
    real_open = open

    def counting_open(path, mode="r", *a, **kw):
        if mode == "rb":  # reading rows (the torn-tail check opens r+b and reads the last byte only)
            reads.append(os.path.basename(str(path)))
        return real_open(path, mode, *a, **kw)

    import builtins

    builtins.open, saved = counting_open, builtins.open
    try:
        again = RunLedger.open(tmp_path, "r")
    finally:
        builtins.open = saved
    assert again.rows == {"id0": 0, "id1": 0, "id2": 1, "id3": 1, "id4": 2}
    assert not {"batch_0.jsonl", "batch_1.jsonl", "batch_2.jsonl"} & set(reads)
    assert again.batch_stats["2"]["processed"] == 1
    # ...and a batch file that changed since (size or time) is scanned again and indexed anew
    with open(tmp_path / "batch_1.jsonl", "ab") as fh:
        fh.write((json.dumps(_row("idX", 9)) + "\n").encode())
    third = RunLedger.open(tmp_path, "r")
    assert third.rows["idX"] == 1 and len(third.rows) == 6
    assert _lines(tmp_path / INDEX_FILE)[-1]["ids"] == ["id2", "id3", "idX"]
    # a torn index line (a killed writer) is ignored: the file is scanned
    with open(tmp_path / INDEX_FILE, "ab") as fh:
        fh.write(b'{"file": "batch_0.js')
    assert RunLedger.open(tmp_path, "r").rows == third.rows


def test_a_checkpoint_waits_a_multiple_of_its_own_write_time(tmp_path, monkeypatch):
    """However often batches finish, the checkpoint (O(run) to write) takes a bounded share of the time."""
    monkeypatch.setattr("hermes_core.runfolder.ledger.CHECKPOINT_INTERVAL", 0.0)
    monkeypatch.setattr(
        "hermes_core.runfolder.ledger.CHECKPOINT_COST_MULTIPLE", 1e9
    )  # any write time: wait "forever"
    ledger = RunLedger.open(tmp_path, "r")
    index_of = {f"id{i}": i for i in range(4)}
    ledger.plan([(i, f"id{i}") for i in range(4)], batch_size=1, index_of=index_of)
    ledger.record_row("id0", _row("id0", 0))  # the first finished batch writes one
    ledger.record_row("id1", _row("id1", 1))  # within 1e9 x its write time: not rewritten
    assert json.loads((tmp_path / "checkpoint.json").read_text())["completed_prompts"] == [0]
    ledger.write_checkpoint()  # the end of the run writes it whatever the wait
    assert json.loads((tmp_path / "checkpoint.json").read_text())["completed_prompts"] == [0, 1]


def test_a_skipped_sample_closes_its_batch_and_leaves_no_trace(tmp_path):
    """--stop_when_passed: a planned sample that will not start resolves its batch, writes nothing and stays pending."""
    ledger = RunLedger.open(tmp_path, "r")
    index_of = {f"id{i}": i for i in range(4)}
    ledger.plan([(i, f"id{i}") for i in range(4)], batch_size=2, index_of=index_of)
    ledger.record_row("id0", _row("id0", 0))
    ledger.record_skipped("id1")  # batch 0 is done: its file closes and gets its index line
    assert [line["ids"] for line in _lines(tmp_path / INDEX_FILE)] == [["id0"]]
    ledger.record_skipped("id2")
    ledger.record_skipped("id3")  # batch 1: nothing but skips, no file, no stats
    ledger.write_checkpoint()
    ledger.close()
    checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    assert checkpoint["batch_stats"] == {"0": {"processed": 1, "skipped": 0, "discarded_no_reasoning": 0}}
    assert sorted(p.name for p in tmp_path.glob("batch_*")) == ["batch_0.jsonl"]
    assert RunLedger.open(tmp_path, "r").finished == {"id0"}  # the skipped ones are still pending
