"""hermes_core.runfolder.early_stop: the passing prompts of a ledger, the saving and pass@k of a run with skipped samples."""

from __future__ import annotations

import json

from hermes_core.runfolder.early_stop import passed_ids, stopped_statistics


def _row(index: int, sample: int, passed: bool | None, api_calls: int = 3, cost: float | None = None) -> dict:
    metadata = {"prompt_id": f"p{index}.{sample}", "sample_index": sample, "usage": {"cost": cost}}
    if passed is not None:
        metadata["passed"] = passed
    return {"prompt_index": index, "metadata": metadata, "api_calls": api_calls}


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_passed_ids_are_the_batch_rows_that_passed(tmp_path):
    _write(tmp_path / "batch_0.jsonl", [_row(0, 0, False), _row(0, 1, True), _row(1, 0, None)])
    _write(tmp_path / "batch_1.jsonl", [_row(2, 0, True)])
    (tmp_path / "rejected.jsonl").write_text(json.dumps(_row(3, 0, True)) + "\n")  # not a ledger file
    assert passed_ids(tmp_path) == {"p0.1", "p2.0"}
    # hermes-batch score's newer results are laid over the rows, as the merge does
    rescore = {"prompt_id": "p0.1", "prompt_index": 0, "score": {"answer": {"value": 0.0, "passed": False}}}
    rescore_0 = {"prompt_id": "p0.0", "prompt_index": 0, "score": {"answer": {"value": 1.0, "passed": True}}}
    _write(tmp_path / "scores.jsonl", [rescore, rescore_0])
    assert passed_ids(tmp_path) == {"p0.0", "p2.0"}
    empty = tmp_path / "empty-run"
    empty.mkdir()
    assert passed_ids(empty) == set()


def test_pass_at_k_stays_true_with_skipped_samples(tmp_path):
    """K = 4. Record 0: fail then pass (2 skipped); 1: pass at once (3 skipped); 2: 4 fails; 3: 1 fail, the rest
    not run yet (no pass: undecided for pass@4); 4: sample 0 failed to run, sample 1 passed (its first scored sample)."""
    rows = [
        _row(0, 0, False),
        _row(0, 1, True),
        _row(1, 0, True),
        *[_row(2, j, False) for j in range(4)],
        _row(3, 0, False),
        _row(4, 1, True),
        _row(5, 0, None),  # not scored: counts in the means per row, not in pass@k
    ]
    kept, rejected = tmp_path / "trajectories.jsonl", tmp_path / "rejected.jsonl"
    _write(kept, rows[:5])
    _write(rejected, rows[5:])
    figures = stopped_statistics([kept, rejected, tmp_path / "absent.jsonl"], samples=4, skipped=8)
    # pass@1 from each record's first scored sample: records 0..4 -> F, P, F, F, P
    assert figures["pass_at_k"] == {"1": 0.4, "4": 0.75}  # decided: 0 P, 1 P, 2 F, 4 P
    assert figures["pass_hat_k"] is None
    assert figures["stopped_when_passed"] == {
        "samples_skipped": 8,
        "requests_saved_estimate": 24.0,  # 8 x the mean of 3 requests per row
        "cost_saved_usd_estimate": None,
    }


def test_the_saving_uses_the_mean_per_row_and_nothing_skipped_keeps_the_usual_pass_at_k(tmp_path):
    rows = tmp_path / "trajectories.jsonl"
    _write(
        rows,
        [
            _row(0, 0, True, api_calls=2, cost=0.01),
            _row(1, 0, False, api_calls=5, cost=0.03),
            _row(2, 0, None, 5),
        ],
    )
    figures = stopped_statistics([rows], samples=4, skipped=3)
    # 3 x 4 requests (mean of 2, 5, 5); 3 x $0.02 (mean over the rows that report a cost)
    assert figures["stopped_when_passed"] == {
        "samples_skipped": 3,
        "requests_saved_estimate": 12.0,
        "cost_saved_usd_estimate": 0.06,
    }
    assert stopped_statistics([rows], samples=4, skipped=0) == {
        "stopped_when_passed": {
            "samples_skipped": 0,
            "requests_saved_estimate": 0.0,
            "cost_saved_usd_estimate": 0.0,
        }
    }
