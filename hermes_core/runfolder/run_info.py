"""Run folder bookkeeping before prompts run: the dataset's identities, run.json, refusal rules.

A run folder is reused only with ``--resume`` (or by a retry of the same flow
run), and only with the same defining settings (README § Resume, retries, identity); ``--overwrite``
starts it again from nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hermes_core.dataset import Dataset, DatasetError, PromptRecord
from hermes_core.runfolder.files import write_json_atomic
from hermes_core.runfolder.folder import BATCH_RE, RunFolder
from hermes_core.runfolder.ledger import now_iso
from hermes_core.runner import PromptJob


class RunStateError(ValueError):
    """The run folder cannot be used as asked (exists without resume, settings changed)."""


@dataclass(frozen=True)
class RunInfo:
    """Contents of ``run.json``: defining settings, dataset fingerprint, invocation history."""

    path: Path
    data: dict[str, Any]

    @property
    def run_id(self) -> str:
        """The run folder's identity: a random id made when the folder's run starts (again on
        ``--overwrite``). It labels the run's containers and keys its task cache, so a new run never
        reaps another run's containers or gets an old run's cached results."""
        return self.data["run_id"]

    @property
    def total_duration(self) -> float:
        """Seconds spent over every invocation of the run (a killed one up to its last finished prompt)."""
        return sum(inv.get("duration_s", 0.0) for inv in self.data.get("invocations", []))


def refused_cwds(config: Any, dataset: Dataset, settings: Any) -> list[tuple[int, str]]:
    """``(line, reason)`` of each record whose ``cwd`` the local sandbox refuses (empty for other backends).

    The rule is :func:`hermes_core.environments.workdir.cwd_problem`: an absolute cwd must lie under
    ``HERMES_CWD_ROOTS`` (default: the dataset file's folder) and may not be, hold or lie inside a
    system or home folder, this run's folder or its output folder. Each distinct cwd is checked once.

    Args:
        config: the run's :class:`~flows.config.BatchConfig` (dataset file, run and output folders, backend).
        dataset: the read dataset.
        settings: ``HermesSettings`` (backend default, ``cwd_roots``, ``cwd_copy_max_mb``).
    """
    from hermes_core.endpoints import resolve_backend
    from hermes_core.environments.workdir import cwd_problem

    if resolve_backend(config.terminal_env, settings) != "local":
        return []
    roots = settings.cwd_roots or [str(Path(config.dataset_file).resolve().parent)]
    refused = [str(config.run_dir.resolve()), str(config.run_dir.resolve().parent)]
    problems: dict[str, str | None] = {}
    found = []
    for line, cwd in dataset.cwds():
        if cwd not in problems:
            problems[cwd] = cwd_problem(
                cwd, roots=roots, refused=refused, max_copy_bytes=settings.cwd_copy_max_mb << 20
            )
        if problems[cwd]:
            found.append((line, f"cwd {problems[cwd]}"))
    return found


def check_cwds(config: Any, dataset: Dataset, settings: Any) -> None:
    """Refuse the dataset when any record has a ``cwd`` the local sandbox refuses (:func:`refused_cwds`).

    Raises:
        DatasetError: naming the file and each refused record's line and reason.
    """
    refused = refused_cwds(config, dataset, settings)
    if refused:
        message = f"{len(refused)} record(s) with a cwd the local sandbox refuses"
        raise DatasetError(config.dataset_file, message, refused)


def has_outputs(run_dir: Path) -> bool:
    """True when the folder holds a run (run.json, a batch file, a checkpoint or trajectories)."""
    if not run_dir.is_dir():
        return False
    folder = RunFolder(run_dir)
    markers = {folder.run_json.name, folder.checkpoint.name, folder.trajectories.name}
    return any(p.name in markers or BATCH_RE.match(p.name) for p in run_dir.iterdir())


KEPT_AS_DIGEST = ("ephemeral_system_prompt", "prefill_messages")
"""Defining settings that run.json keeps as a digest, not as text: they are kept out of the data
(trajectories, exports), and a run folder is data that people share."""


def stored_settings(defining: dict[str, Any]) -> dict[str, Any]:
    """The defining settings as run.json keeps them: each of :data:`KEPT_AS_DIGEST` that is set
    becomes ``{"sha256": hex digest of its JSON, "chars": length of that JSON}``; the rest as is.

    A value already in that form (read from run.json) is left as it is; so is None.
    """
    stored = dict(defining)
    for key in KEPT_AS_DIGEST:
        value = stored.get(key)
        if value is None or value == [] or (isinstance(value, dict) and "sha256" in value):
            continue
        blob = json.dumps(value, sort_keys=True, ensure_ascii=False)
        stored[key] = {"sha256": hashlib.sha256(blob.encode()).hexdigest(), "chars": len(blob)}
    return stored


def check_run_dir(run_dir: Path, defining: dict[str, Any], *, resume: bool, overwrite: bool) -> None:
    """Apply the reuse rules; with ``overwrite`` empty the folder first.

    ``defining`` is compared with run.json's as :func:`stored_settings` keeps both (a run.json
    written before the digests compares the same).

    Raises:
        RunStateError: outputs exist and neither resume nor overwrite was asked, or the
            defining settings differ from run.json (the message lists the differences).
    """
    if overwrite:
        clear_run_dir(run_dir)
        return
    if not has_outputs(run_dir):
        return
    if not resume:
        raise RunStateError(
            f"run folder {run_dir} already has outputs; pass --resume to continue it "
            "or --overwrite to start again"
        )
    info = read_run_info(run_dir)
    if info is None:
        return
    before = stored_settings(info.data.get("defining", {}))
    defining = stored_settings(defining)
    changed = [
        f"{key}: {before.get(key)!r} -> {defining.get(key)!r}"
        for key in sorted(set(before) | set(defining))
        if before.get(key) != defining.get(key)
    ]
    if changed:
        raise RunStateError(
            f"run folder {run_dir} was made with other defining settings ({'; '.join(changed)}); "
            "use --overwrite to start again or choose another --run_name"
        )


def clear_run_dir(run_dir: Path) -> None:
    """Delete every output of a run (batch files, ledger, cache), keeping the folder and its lock."""
    if not run_dir.is_dir():
        return
    folder = RunFolder(run_dir)
    for path in run_dir.iterdir():
        if path.name == folder.lock.name:
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def read_run_info(run_dir: Path) -> RunInfo | None:
    """``run.json`` of a run folder, or None."""
    path = RunFolder(run_dir).run_json
    if not path.exists():
        return None
    return RunInfo(path, json.loads(path.read_text(encoding="utf-8")))


def resolve_dataset(run_dir: Path, given: str | None) -> Path | None:
    """The dataset file: as written in run.json (absolute, or relative to the working directory,
    the folder above the run's output folder, or the output folder), or None when none exists."""
    if not given:
        return None
    path = Path(given)
    candidates = [path] if path.is_absolute() else [path, run_dir.parent.parent / path, run_dir.parent / path]
    return next((c for c in candidates if c.is_file()), None)


def start_invocation(
    run_dir: Path,
    run_name: str,
    defining: dict[str, Any],
    settings_hash: str,
    dataset: Dataset,
    flow_run_id: str | None,
    samples: int = 1,
) -> RunInfo:
    """Record the start of an invocation in run.json (created on first use) and return it.

    An earlier invocation that never finished (killed) gets its duration from the ledger: from its
    start to the last row, tombstone or failure it wrote.
    """
    info = read_run_info(run_dir)
    data = info.data if info else {"run_name": run_name, "created_at": now_iso(), "invocations": []}
    data.setdefault("run_id", uuid.uuid4().hex)
    _close_killed_invocations(run_dir, data["invocations"])
    data.update(
        defining=stored_settings(defining),
        settings_hash=settings_hash,
        dataset={"path": dataset.path, "fingerprint": dataset.fingerprint, "records": len(dataset)},
        samples_per_prompt=samples,
    )
    data["invocations"].append({"started_at": now_iso(), "flow_run_id": flow_run_id})
    path = RunFolder(run_dir).run_json
    write_json_atomic(path, data)
    return RunInfo(path, data)


def _close_killed_invocations(run_dir: Path, invocations: list[dict[str, Any]]) -> None:
    """Give every invocation without ``finished_at`` a ``duration_s`` from the ledger's timestamps."""
    if not invocations:
        return
    ends = [inv.get("started_at") for inv in invocations[1:]] + [None]
    for inv, next_start in zip(invocations, ends, strict=True):
        if "finished_at" in inv or "duration_s" in inv or not inv.get("started_at"):
            continue
        start, stop = _parse(inv["started_at"]), _parse(next_start) if next_start else None
        last = last_activity(run_dir, start, stop)
        inv.update(duration_s=round((last - start).total_seconds(), 3) if last else 0.0, killed=True)


def last_activity(run_dir: Path, start: datetime, stop: datetime | None) -> datetime | None:
    """The latest time in [start, stop) (stop None: no end) at which the ledger wrote something (None: nothing).

    Batch files are written by one invocation only, so their modification time is its last row;
    tombstones and failures carry their own ``time``.
    """
    times = []
    for path in run_dir.iterdir():
        if BATCH_RE.match(path.name):
            times.append(datetime.fromtimestamp(path.stat().st_mtime, UTC).replace(tzinfo=None))
    folder = RunFolder(run_dir)
    for path in (folder.discarded, folder.failures):
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    times.append(_parse(json.loads(line)["time"]))
                except (ValueError, KeyError, TypeError):
                    continue
    inside = [t for t in times if start <= t and (stop is None or t < stop)]
    return max(inside) if inside else None


def _parse(stamp: str) -> datetime:
    """A ledger timestamp (UTC, ISO-8601 to the second, no offset)."""
    return datetime.fromisoformat(stamp).replace(tzinfo=None)


def finish_invocation(info: RunInfo, **facts: Any) -> None:
    """Close the current invocation's entry in run.json with its duration and counts."""
    info.data["invocations"][-1].update(finished_at=now_iso(), **facts)
    write_json_atomic(info.path, info.data)


def prompt_identity(content_key: str, settings_hash: str, sample_index: int = 0) -> str:
    """Identity of a prompt (one sample of a record) in a run: its record's content key (content +
    occurrence), the defining settings and the sample's index (sample 0's identity is the record's
    identity of a run with one sample per record, so more samples add to a run instead of replacing it)."""
    sample = f"|{sample_index}" if sample_index else ""
    return hashlib.sha256(f"{content_key}|{settings_hash}{sample}".encode()).hexdigest()[:32]


def prompt_ids(dataset: Dataset, settings_hash: str, samples: int = 1) -> list[str]:
    """Every prompt identity of a run, by slot: ``slot = prompt_index * samples + sample_index``.

    No record is read from the file.
    """
    return [
        prompt_identity(key, settings_hash, sample)
        for key in dataset.content_keys()
        for sample in range(samples)
    ]


def job_of(record: PromptRecord, prompt_id: str, sample_index: int = 0) -> PromptJob:
    """A record's sample as the prompt job of a run (``prompt_id``: its identity, :func:`prompt_identity`)."""
    return PromptJob(
        prompt_index=record.prompt_index,
        sample_index=sample_index,
        prompt_id=prompt_id,
        record_key=record.content_key,
        prompt=record.prompt,
        image=record.image,
        cwd=record.cwd,
        source=record.source,
    )


def iter_jobs(
    dataset: Dataset, settings_hash: str, slots: Iterable[int] | None = None, samples: int = 1
) -> Iterator[PromptJob]:
    """The prompt jobs of ``slots`` (default: every sample of every record), in that order, each record read when it is reached.

    A slot is ``prompt_index * samples + sample_index`` (:func:`prompt_ids`' order). The flow draws
    its prompts from this one at a time, so only the prompts in flight are in memory.
    """
    if slots is None:
        for record in dataset.records:  # read in file order
            for sample in range(samples):
                yield job_of(record, prompt_identity(record.content_key, settings_hash, sample), sample)
        return
    for slot in slots:
        index, sample = divmod(slot, samples)
        identity = prompt_identity(dataset.content_key(index), settings_hash, sample)
        yield job_of(dataset.record(index), identity, sample)


def jobs_of(dataset: Dataset, settings_hash: str, samples: int = 1) -> list[PromptJob]:
    """Every sample of every record as a prompt job, in memory (for small datasets: tests, tools; the flow uses :func:`iter_jobs`)."""
    return list(iter_jobs(dataset, settings_hash, samples=samples))


__all__ = [
    "KEPT_AS_DIGEST",
    "resolve_dataset",
    "RunInfo",
    "RunStateError",
    "check_cwds",
    "check_run_dir",
    "clear_run_dir",
    "finish_invocation",
    "has_outputs",
    "iter_jobs",
    "job_of",
    "jobs_of",
    "last_activity",
    "prompt_identity",
    "prompt_ids",
    "read_run_info",
    "refused_cwds",
    "start_invocation",
    "stored_settings",
]
