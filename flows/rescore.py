"""``hermes-batch score data/<run>``: score a finished run's rows again, without running the agent.

Each row of the run's batch files (the first of each prompt_id, as the merge takes it) is scored
by the scorers named (``answer``, ``judge``, ``python:module:function``; ``auto`` means
``answer`` for the records that have one). ``verify`` cannot be used: it runs in the prompt's
sandbox, which is gone once the prompt has finished.

The record a row is scored against is the row's own copy of its record (``metadata.source``, the
prompt from its first human turn), or with ``--dataset FILE`` the record at the row's
``prompt_index`` of that file (its prompt must be the row's): a corrected reference answer is
scored without a new run.

Results are appended to ``scores.jsonl`` (:mod:`hermes_core.runfolder.rescores`), one fsynced line
per row; no batch file is rewritten. A line carries a ``scoring_key`` (the scorers, the judge's
settings and the record's fields the scorers read): a second ``score`` with the same key skips
the rows already done, so a killed ``score`` loses at most the row it was on and re-pays no judge
request. Then the merge and the statistics run again, so ``trajectories.jsonl``,
``rejected.jsonl``, ``statistics.json``, the viewer and the export show the newest scores.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_core.dataset import Dataset, read_dataset
from hermes_core.exceptions import HermesError
from hermes_core.redaction import register_secrets_of
from hermes_core.runfolder.files import append_jsonl, iter_raw_lines, loads_object, repair_torn_tail
from hermes_core.runfolder.folder import RunFolder
from hermes_core.runfolder.ledger import RunInUseError, RunLock
from hermes_core.runfolder.postprocess import compute_statistics, merge_trajectories, write_json_atomic
from hermes_core.runfolder.rescores import read_rescores
from hermes_core.runfolder.run_info import prompt_ids, read_run_info, resolve_dataset
from hermes_core.scoring import (
    JUDGE_MAX_TOKENS,
    PYTHON_PREFIX,
    applied_scorers,
    check_scorers,
    describe_pass_at_k,
    describe_scores,
    score_answer,
    score_judge,
    score_python,
)
from hermes_core.settings import HermesSettings
from hermes_core.tools import ALL_POSSIBLE_TOOLS
from hermes_core.trajectory import timestamp_now
from hermes_core.usage import Usage

if TYPE_CHECKING:
    from hermes_core.client import ModelClient


class RescoreError(ValueError):
    """Bad input of ``hermes-batch score`` (a scorer it cannot use, a dataset that does not fit the rows)."""


@dataclass
class RescoreResult:
    """What a ``score`` did: rows scored now, rows skipped (already scored with this key), the judge's usage, the statistics."""

    scored: int = 0
    skipped: int = 0
    usage: Usage = field(default_factory=Usage)
    statistics: dict[str, Any] = field(default_factory=dict)


def check_rescorers(names: list[str]) -> list[str]:
    """``--scorer`` of ``score`` checked: ``verify`` refused with the reason, the others as :func:`check_scorers`.

    Raises:
        RescoreError: ``verify`` is named, or a scorer is unknown or cannot be loaded.
    """
    if "verify" in names:
        raise RescoreError(
            "--scorer verify cannot re-score: a verify command runs in the prompt's own sandbox, which "
            "is gone once the prompt has finished (verify runs only during a run)"
        )
    try:
        return check_scorers(names)
    except ValueError as exc:
        raise RescoreError(f"--scorer: {exc}") from None


def rescore_run(
    run_dir: Path,
    scorers: list[str],
    *,
    dataset_path: str | None = None,
    judge_model: str | None = None,
    judge_base_url: str | None = None,
    judge_rubric: str | None = None,
    workers: int = 8,
    settings: HermesSettings | None = None,
) -> RescoreResult:
    """Score ``run_dir``'s rows with ``scorers``, append to ``scores.jsonl``, merge and compute statistics again.

    Args:
        run_dir: a run folder (``run.json`` and batch files).
        scorers: checked by :func:`check_rescorers`.
        dataset_path: take records from this dataset (by prompt_index) instead of the rows' copies.
        judge_model / judge_base_url / judge_rubric: the judge (default: the run's model and
            endpoint from ``run.json``, the built-in rubric).
        workers: rows scored at once (the judge's requests in flight).
        settings: the API key and request settings (default: from the environment).

    Raises:
        RescoreError: not a run folder, a scorer that cannot be used, a dataset whose prompts are
            not the rows' (naming the row and the line).
        RunInUseError: a run (or another score) holds the folder.
        ScorerError: a judge request failed after its retries (what was scored before is kept).
    """
    folder = RunFolder(run_dir)
    info = read_run_info(run_dir)
    if info is None:
        raise RescoreError(f"{run_dir}: not a run folder (no {folder.run_json.name})")
    scorers = check_rescorers(scorers)
    with RunLock(run_dir):  # no run, and no other score, writes the folder meanwhile
        return _rescore(
            run_dir,
            info.data,
            scorers,
            dataset_path,
            judge_model,
            judge_base_url,
            judge_rubric,
            workers,
            settings,
        )


def _rescore(
    run_dir: Path,
    run: dict[str, Any],
    scorers: list[str],
    dataset_path: str | None,
    judge_model: str | None,
    judge_base_url: str | None,
    judge_rubric: str | None,
    workers: int,
    settings: HermesSettings | None,
) -> RescoreResult:
    """:func:`rescore_run` once the folder is held."""
    folder = RunFolder(run_dir)
    settings = settings or HermesSettings()
    register_secrets_of(settings)
    dataset = read_dataset(dataset_path) if dataset_path else None
    defining = run.get("defining", {})
    judge = None
    if "judge" in scorers:  # the model API client only then (openai's import is ~1 s)
        from hermes_core.client import side_client
        from hermes_core.limiter import ConcurrencyLimiter

        judge = side_client(
            judge_model or defining.get("model") or "mock/judge",
            judge_base_url,
            settings,
            max_tokens=JUDGE_MAX_TOKENS,
            temperature=0.0,
            limiter=ConcurrencyLimiter(workers),
        )
    judge_facts = [judge_model, judge_base_url, judge_rubric] if judge else None
    done = read_rescores(run_dir)
    result = RescoreResult()

    def todo() -> Iterator[tuple[dict[str, Any], dict[str, Any], list[str], str]]:
        """The rows to score now, read one at a time (a run's rows never all in memory)."""
        for row in _first_rows(folder):
            record = _record_of(row, dataset, dataset_path)
            applied = [s for s in applied_scorers(scorers, record) if s != "verify"]
            if not applied:
                continue
            key = _scoring_key(applied, record, judge_facts)
            if key in done.get(row["metadata"]["prompt_id"], {}).get("keys", ()):
                result.skipped += 1
                continue
            yield row, record, applied, key

    def write(future: Future) -> None:
        (row, _record, _applied, key), (scores, usage) = future.result()
        append_jsonl(
            out,
            {
                "prompt_id": row["metadata"]["prompt_id"],
                "prompt_index": row.get("prompt_index"),
                "scoring_key": key,
                "score": scores,
                "usage": usage.as_dict() if usage else None,
                "timestamp": timestamp_now(),
            },
        )
        result.scored += 1
        if usage:
            result.usage.add(usage)

    def score_one(item):
        row, record, applied, _key = item
        return item, _score_row(row, record, applied, judge, judge_rubric)

    if folder.scores.exists():
        repair_torn_tail(folder.scores)  # a killed score's half line
    with open(folder.scores, "ab") as out, ThreadPoolExecutor(max_workers=workers) as pool:
        window: deque[Future] = deque()  # at most 2 x workers rows in flight
        for item in todo():
            window.append(pool.submit(score_one, item))
            while len(window) >= 2 * workers:
                write(window.popleft())
        while window:
            write(window.popleft())
    result.statistics = _merge_and_count(run_dir, run, [s for s in scorers if s.startswith(PYTHON_PREFIX)])
    return result


def _first_rows(folder: RunFolder) -> Iterator[dict[str, Any]]:
    """The rows of the batch files with a prompt_id, the first of each prompt_id (as the merge keeps them)."""
    seen: set[str] = set()
    for path in folder.batch_files():
        for _offset, raw, _line_no, _is_last in iter_raw_lines(path):
            row = loads_object(raw)
            metadata = row.get("metadata") if row else None
            prompt_id = metadata.get("prompt_id") if isinstance(metadata, dict) else None
            if isinstance(prompt_id, str) and prompt_id not in seen:
                seen.add(prompt_id)
                yield row


def _first_human(row: dict[str, Any]) -> str:
    """The value of the row's first human turn (its prompt), or ``""``."""
    return next((t.get("value", "") for t in row.get("conversations", []) if t.get("from") == "human"), "")


def _final_text(row: dict[str, Any]) -> str | None:
    """The value of the row's last gpt turn (its final answer), or None."""
    turns = [t for t in row.get("conversations", []) if t.get("from") == "gpt"]
    return turns[-1].get("value") if turns else None


def _record_of(row: dict[str, Any], dataset: Dataset | None, dataset_path: str | None) -> dict[str, Any]:
    """The record ``row`` is scored against: ``{"prompt", **fields}`` (see the module docstring).

    Raises:
        RescoreError: ``dataset`` has no record at the row's prompt_index, or its prompt differs.
    """
    source = row["metadata"].get("source")
    if dataset is None:
        return {"prompt": _first_human(row), **(source if isinstance(source, dict) else {})}
    index = row.get("prompt_index")
    if not isinstance(index, int) or not 0 <= index < len(dataset):
        raise RescoreError(f"{dataset_path}: no record for the row of prompt_index {index}")
    record = dataset.record(index)
    if record.prompt != _first_human(row):
        raise RescoreError(
            f"{dataset_path} line {record.line}: its prompt is not the prompt of the run's row "
            f"{index} (is it the run's dataset?)"
        )
    return {"prompt": record.prompt, **record.source}


def _scoring_key(applied: list[str], record: dict[str, Any], judge: list[Any] | None) -> str:
    """sha256 (32 hex) of what decides a row's new scores: the scorers, the record's answer, the judge's settings."""
    blob = json.dumps([applied, record.get("answer"), judge], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _score_row(
    row: dict[str, Any],
    record: dict[str, Any],
    applied: list[str],
    judge: ModelClient | None,
    rubric: str | None,
) -> tuple[dict[str, dict[str, Any]], Usage | None]:
    """(``{scorer: result}``, the judge's usage or None) of one row."""
    scores: dict[str, dict[str, Any]] = {}
    usage = None
    for name in applied:
        if name == "answer":
            scores[name] = score_answer(_final_text(row), record["answer"])
        elif name == "judge" and judge is not None:
            scores[name], usage = score_judge(
                judge, record["prompt"], _final_text(row), record.get("answer"), rubric
            )
        elif name.startswith(PYTHON_PREFIX):
            scores[name] = score_python(name, row, record)
    return scores, usage


def _merge_and_count(run_dir: Path, run: dict[str, Any], python_scorers: list[str]) -> dict[str, Any]:
    """Merge again (the last merge's ``--keep``) and write statistics.json again, keeping its other figures."""
    folder = RunFolder(run_dir)
    state = json.loads(folder.merge_state().read_text()) if folder.merge_state().exists() else {}
    keep = state.get("merge", {}).get("keep", "all")
    index_of = _index_of(run_dir, run)
    merge = merge_trajectories(run_dir, index_of=index_of, valid_tools=ALL_POSSIBLE_TOOLS, keep=keep)
    old = json.loads(folder.statistics.read_text()) if folder.statistics.exists() else {}
    defining = run.get("defining", {})
    samples = int(run.get("samples_per_prompt") or 1)
    stats = compute_statistics(
        run_dir,
        merge=merge,
        run_name=old.get("run_name") or run.get("run_name", Path(run_dir).name),
        distribution=old.get("distribution") or defining.get("distribution", "default"),
        model=old.get("model") or defining.get("model", ""),
        batch_size=old.get("batch_size") or 0,
        index_of=index_of if index_of is not None else _own_indexes(folder),
        duration_seconds=old.get("duration_seconds", 0.0),
        failed_prompt_ids=(),
        valid_tools=ALL_POSSIBLE_TOOLS,
        flow_run_id=old.get("flow_run_id"),
        samples_per_prompt=samples,
        scorers=python_scorers + [s for s in old.get("scores", {}) if s.startswith(PYTHON_PREFIX)],
    )
    # the flow's own figures stay: run control (budget, concurrency), this invocation's failures
    stats = {**old, **stats, "failed": old.get("failed", 0)}
    write_json_atomic(folder.statistics, stats)
    return stats


def _index_of(run_dir: Path, run: dict[str, Any]) -> dict[str, int] | None:
    """prompt_id -> prompt_index of the run's dataset as run.json names it, when that file is unchanged; else None."""
    recorded = run.get("dataset") or {}
    found = resolve_dataset(Path(run_dir), recorded.get("path"))
    if found is None:
        return None
    dataset = read_dataset(found)
    if dataset.fingerprint != recorded.get("fingerprint"):
        return None
    samples = int(run.get("samples_per_prompt") or 1)
    ids = prompt_ids(dataset, run.get("settings_hash", ""), samples)
    return {pid: slot // samples for slot, pid in enumerate(ids)}


def _own_indexes(folder: RunFolder) -> dict[str, int]:
    """prompt_id -> the row's own prompt_index, over the batch files (when the dataset cannot be read)."""
    return {row["metadata"]["prompt_id"]: row.get("prompt_index", 0) for row in _first_rows(folder)}


def describe(result: RescoreResult) -> str:
    """The command's summary lines: rows scored and skipped, the new scores, pass@k, the judge's usage."""
    stats = result.statistics
    lines = [f"Scored {result.scored} row(s); {result.skipped} already scored with these settings (skipped)."]
    if stats.get("scores"):
        lines.append(f"Scores: {describe_scores(stats['scores'])}")
    if stats.get("pass_at_k"):
        lines.append(f"Pass: {describe_pass_at_k(stats['pass_at_k'], stats.get('pass_hat_k'))}")
    if result.usage.total_tokens:
        cost = f", ${result.usage.cost:.4f}" if result.usage.cost is not None else ""
        lines.append(f"Judge: {result.usage.total_tokens} tokens{cost}")
    return "\n".join(lines)


def main(args: Any) -> int:
    """Run ``score`` from parsed arguments (:func:`flows.commands.build_score_parser`); the exit code."""
    from flows.config import load_rubric

    try:
        rubric = load_rubric(args.judge_rubric_file) if args.judge_rubric_file else None
        result = rescore_run(
            Path(args.run_dir),
            [s.strip() for s in args.scorer.split(",") if s.strip()],
            dataset_path=args.dataset,
            judge_model=args.judge_model,
            judge_base_url=args.judge_base_url,
            judge_rubric=rubric,
            workers=args.num_workers,
        )
    except (RescoreError, RunInUseError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except HermesError as exc:  # a judge request failed after its retries: what was scored is kept
        print(f"error: {exc} (the rows scored before it are kept; run score again to go on)", file=sys.stderr)
        return 1
    print(describe(result))
    return 0


__all__ = ["RescoreError", "RescoreResult", "check_rescorers", "describe", "main", "rescore_run"]
