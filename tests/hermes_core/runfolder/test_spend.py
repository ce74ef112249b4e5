"""The run's spend from its ledger (hermes_core.runfolder.spend): spend.json is trusted only where it still matches the files."""

from __future__ import annotations

import json

import pytest

from hermes_core.runfolder.ledger import RunLedger
from hermes_core.runfolder.spend import Spend, SpendTally


def _usage(prompt: int, completion: int, cost: float | None) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "reasoning_tokens": 0, "cost": cost}


def _row(pid: str, index: int, usage: dict) -> dict:
    return {
        "prompt_index": index,
        "conversations": [],
        "metadata": {"batch_num": None, "prompt_id": pid, "usage": usage},
    }


def _fill(ledger: RunLedger, ids: range) -> None:
    ledger.plan([(i, f"id{i}") for i in ids], batch_size=2, index_of={f"id{i}": i for i in ids})
    for i in ids:
        if i % 3 == 0:
            ledger.record_failure(
                f"id{i}", i, "ModelError", "HTTP 500", attempts=1, usage=_usage(10, 1, 0.01)
            )
        elif i % 3 == 1:
            ledger.record_discard(
                f"id{i}", {"prompt_index": i, "assistant_turns": 1, "usage": _usage(20, 2, None)}
            )
        else:
            ledger.record_row(f"id{i}", _row(f"id{i}", i, _usage(100, 10, 0.1)))


def _expected(ids: range) -> Spend:
    spend = Spend()
    for i in ids:
        spend.add_usage(
            _usage(10, 1, 0.01) if i % 3 == 0 else _usage(20, 2, None) if i % 3 == 1 else _usage(100, 10, 0.1)
        )
    return spend


def _same(a: Spend, b: Spend) -> bool:
    return a.cost == pytest.approx(b.cost) and {**vars(a), "cost": 0} == {**vars(b), "cost": 0}


def test_resume_trusts_spend_json_and_counts_every_kind_of_line(tmp_path):
    ledger = RunLedger.open(tmp_path, "r")
    _fill(ledger, range(9))
    ledger.write_checkpoint()
    ledger.close()
    again = RunLedger.open(tmp_path, "r")
    assert again.spend.reparsed == []  # nothing parsed: spend.json covers every file as it is
    assert _same(again.spend.total, _expected(range(9)))
    assert again.spend.total.cost_usd() == pytest.approx(3 * 0.01 + 3 * 0.1)
    # the discards reported no cost: priced per million tokens
    assert again.spend.total.cost_usd(price_in=1.0, price_out=2.0) == pytest.approx(
        0.33 + (60 * 1 + 6 * 2) / 1e6
    )


def test_lines_written_after_the_last_checkpoint_are_counted_from_their_offset(tmp_path):
    ledger = RunLedger.open(tmp_path, "r")
    _fill(ledger, range(6))
    ledger.write_checkpoint()
    saved = json.loads((tmp_path / "spend.json").read_text())
    ledger2 = RunLedger.open(tmp_path, "r")  # a killed invocation: appends, never checkpoints
    ledger2.plan([(i, f"id{i}") for i in range(6, 9)], batch_size=5, index_of={})
    for i in range(6, 9):
        ledger2.record_row(f"id{i}", _row(f"id{i}", i, _usage(100, 10, 0.1)))
    (tmp_path / "spend.json").write_text(json.dumps(saved))  # as the killed one left it
    reopened = SpendTally.load(tmp_path)
    assert reopened.reparsed == ["batch_3.jsonl"]  # a file spend.json never saw: parsed whole
    expected = _expected(range(6))
    for _ in range(3):
        expected.add_usage(_usage(100, 10, 0.1))
    assert _same(reopened.total, expected)
    with open(tmp_path / "failures.jsonl", "ab") as fh:  # a grown file: only its new bytes
        fh.write((json.dumps({"prompt_id": "x", "usage": _usage(1, 1, 0.5)}) + "\n").encode())
    grown = SpendTally.load(tmp_path)
    assert any(name.startswith("failures.jsonl[") for name in grown.reparsed)
    assert grown.total.cost == pytest.approx(expected.cost + 0.5)


def test_without_spend_json_everything_is_recomputed(tmp_path):
    ledger = RunLedger.open(tmp_path, "r")
    _fill(ledger, range(7))
    ledger.write_checkpoint()
    ledger.close()
    (tmp_path / "spend.json").unlink()
    tally = SpendTally.load(tmp_path)
    assert sorted(tally.reparsed) == ["batch_1.jsonl", "batch_2.jsonl", "discarded.jsonl", "failures.jsonl"]
    assert _same(tally.total, _expected(range(7)))


def test_spend_json_sizes_are_the_files_sizes_across_invocations(tmp_path):
    """The sizes kept in memory as lines are appended match the files, also when a resume appends to them."""
    ledger = RunLedger.open(tmp_path, "r")
    _fill(ledger, range(5))  # batch 2 (id4) stays open: a later invocation appends to it
    ledger.write_checkpoint()
    ledger.close()
    again = RunLedger.open(tmp_path, "r")
    again.plan([(5, "id5")], batch_size=2, index_of={f"id{i}": i for i in range(6)})
    again.record_failure("id5", 5, "ModelError", "HTTP 500", attempts=1, usage=_usage(10, 1, 0.01))
    again.write_checkpoint()
    again.close()
    files = json.loads((tmp_path / "spend.json").read_text())["files"]
    assert files and {name: entry["size"] for name, entry in files.items()} == {
        name: (tmp_path / name).stat().st_size for name in files
    }
    assert RunLedger.open(tmp_path, "r").spend.reparsed == []


def test_the_budget_check_has_no_side_effect_and_refuse_holds_new_attempts(tmp_path):
    from flows.budget import Admission, Budget
    from hermes_core import cancel
    from hermes_core.exceptions import PromptCancelled
    from hermes_core.runfolder.spend import SpendTally

    tally = SpendTally(tmp_path)
    budget = Budget(tally, max_total_tokens=100)
    assert budget.admission(0) is Admission.START and budget.admission(1) is Admission.WAIT  # slow start
    tally.add("batch_0.jsonl", _usage(60, 0, None), 10)  # one prompt finished: 60 tokens
    assert budget.admission(0) is Admission.CAP  # 60 + one more at the mean passes 100
    assert not budget.allows(0)
    assert not budget.reached and budget.spent_at_stop is None  # asking changed nothing
    cancel.check_may_start(retry=True)  # and held nothing
    try:
        budget.refuse()
        assert budget.reached and budget.spent_at_stop == (0.0, 60)
        with pytest.raises(PromptCancelled):
            cancel.check_may_start(retry=True)
        budget.refuse()  # idempotent
        assert budget.admission(0) is Admission.CAP
    finally:
        cancel.hold_new_prompts(False)
