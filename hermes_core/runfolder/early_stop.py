"""What ``--stop_when_passed`` reads from a run folder (README § Scoring).

With ``--stop_when_passed`` and K samples per record, once a sample of a record passes (its row's
``metadata.passed`` is true), the record's samples that have not started do not start. A skipped
sample leaves nothing in the ledger: it is no row, no failure and costs nothing; it stays pending,
so a resume with the option skips it again (its record has a passing row) and a resume without it
runs it. This module gives the flow:

* :func:`passed_ids`: the prompts whose row in the ledger's batch files passed;
* :func:`stopped_statistics`: the saving (samples skipped, requests and cost saved, estimated) and
  pass@k figures that stay true when records have fewer than K samples because of the skips.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from hermes_core.runfolder.files import iter_raw_lines, line_chunks, loads_object
from hermes_core.runfolder.folder import RunFolder
from hermes_core.runfolder.ledger import row_prompt_id
from hermes_core.runfolder.rescores import apply_rescore, read_rescores

__all__ = ["passed_ids", "stopped_statistics"]

_CHUNK_BYTES = 4 << 20  # bytes of lines decoded per polars call (as the statistics do)


def passed_ids(run_dir: Path) -> set[str]:
    """The prompt ids of the rows of ``run_dir``'s batch files whose ``metadata.passed`` is true.

    Only ``metadata.prompt_id`` and ``metadata.passed`` are decoded. Call it after the ledger has
    opened (it repairs a torn last line). Scores given later by ``hermes-batch score``
    (``scores.jsonl``) are laid over the rows they name, as the merge does (those rows are read whole).

    Raises:
        OSError: a batch file cannot be read.
        polars.exceptions.PolarsError: a batch file holds a line that is not JSON.
    """
    schema = {"metadata": pl.Struct({"prompt_id": pl.String, "passed": pl.Boolean})}
    found: set[str] = set()
    for path in RunFolder(run_dir).batch_files():
        for chunk in line_chunks(path, _CHUNK_BYTES):
            meta = pl.read_ndjson(chunk, schema=schema).get_column("metadata").struct
            frame = pl.DataFrame({"id": meta.field("prompt_id"), "passed": meta.field("passed")})
            found.update(frame.filter(pl.col("passed")).get_column("id").drop_nulls().to_list())
    rescores = read_rescores(run_dir)
    for path in RunFolder(run_dir).batch_files() if rescores else []:
        for _offset, raw, _line, _last in iter_raw_lines(path):
            if row_prompt_id(raw) in rescores and (row := loads_object(raw)) and apply_rescore(row, rescores):
                prompt_id = row["metadata"]["prompt_id"]
                (found.add if row["metadata"]["passed"] else found.discard)(prompt_id)
    return found


def stopped_statistics(paths: Iterable[Path], samples: int, skipped: int) -> dict[str, Any]:
    """The statistics of a run whose records may lack samples because ``--stop_when_passed`` skipped them.

    Args:
        paths: the run's finished rows (``trajectories.jsonl`` and ``rejected.jsonl``; missing files are skipped).
        samples: samples per record (K).
        skipped: samples held back now (pending samples of records with a passing row).

    Returns:
        ``{"stopped_when_passed": {samples_skipped, requests_saved_estimate,
        cost_saved_usd_estimate}}``: ``skipped`` times the mean ``api_calls`` (model requests) and the
        mean ``metadata.usage.cost`` (USD, over the rows that report one; None when none does) of the rows; estimates, as
        a skipped sample might have taken more or fewer requests than the mean. With ``skipped`` > 0
        and scored rows, also ``pass_at_k`` and ``pass_hat_k`` to use instead of the usual ones (the
        usual estimator assumes a record's missing samples are missing by chance; these were
        missing because an earlier one passed): ``pass_at_k["<K>"]`` is exact (a record passes
        when one of its samples passed; a record without a pass counts once it has K scored
        samples), ``pass_at_k["1"]`` is the pass rate of each record's first scored sample (the
        lowest ``metadata.sample_index``, run before any skip could apply: unbiased, from fewer
        samples), and ``pass_hat_k`` is None (whether all K would have passed is not known).
    """
    schema = {
        "prompt_index": pl.Int64,
        "api_calls": pl.Int64,
        "metadata": pl.Struct(
            {
                "passed": pl.Boolean,
                "sample_index": pl.Int64,
                "usage": pl.Struct({"cost": pl.Float64}),
            }
        ),
    }
    rows = calls = cost_reports = 0
    cost = 0.0
    records: dict[int, list] = {}  # prompt_index -> [scored, passed, first sample index, its passed]
    for path in paths:
        for chunk in line_chunks(Path(path), _CHUNK_BYTES):
            meta = pl.read_ndjson(chunk, schema=schema).unnest("metadata")
            rows += meta.height
            calls += int(meta.get_column("api_calls").sum() or 0)
            costs = meta.get_column("usage").struct.field("cost").drop_nulls()
            cost_reports += costs.len()
            cost += float(costs.sum() or 0.0)
            scored = meta.filter(pl.col("passed").is_not_null() & pl.col("prompt_index").is_not_null())
            for index, sample, passed in scored.select(
                "prompt_index", pl.col("sample_index").fill_null(0), "passed"
            ).iter_rows():
                record = records.setdefault(index, [0, 0, sample, passed])
                record[0] += 1
                record[1] += passed
                if sample < record[2]:
                    record[2:] = [sample, passed]
    mean_calls = calls / rows if rows else 0.0
    figures: dict[str, Any] = {
        "stopped_when_passed": {
            "samples_skipped": skipped,
            "requests_saved_estimate": round(skipped * mean_calls, 1),
            "cost_saved_usd_estimate": round(skipped * cost / cost_reports, 6) if cost_reports else None,
        }
    }
    if skipped and records:
        firsts = [first_passed for _, _, _, first_passed in records.values()]
        decided = [passed > 0 for scored, passed, _, _ in records.values() if passed or scored >= samples]
        pass_at_k = {"1": round(sum(firsts) / len(firsts), 4)}
        if decided:
            pass_at_k[str(samples)] = round(sum(decided) / len(decided), 4)
        figures.update(pass_at_k=pass_at_k, pass_hat_k=None)
    return figures
