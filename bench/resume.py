"""Resume speed: ``--resume`` of a finished 10,000-prompt run, and of one where 1% must re-run.

The 10,000-prompt run folder is synthesised through the product's own code path: a real
seed run of 20 prompts (the flow, against the mock model) gives real rows and cache records;
every other prompt gets a copy of a seed row with its own identity (prompt_index, prompt_id,
prompt text, source), written by :class:`hermes_core.runfolder.ledger.RunLedger` (``record_row``, fsync per
row; ``record_failure``; ``write_checkpoint``), with ``run.json`` from
``hermes_core.runfolder.run_info`` and ``trajectories.jsonl`` / ``statistics.json`` from
``hermes_core.runfolder.postprocess``, so every file is byte-for-byte what a real run writes. The 1% case has
1% of the prompts with a failure line and no row (failed prompts are never cached).
Above :data:`CACHE_RECORDS_UP_TO` prompts the synthesis leaves out the per-prompt cache records (a
resume never reads them when the ledger says a prompt is finished, and 10^6 small files would
dominate the copies) and skips ``fsync`` (the bytes written are the same; only the synthesis's
durability differs).
The folders are cached under ``$HERMES_BENCH_DIR/resume-cache`` and copied before each timing
(batch files and ``trajectories.jsonl``, which a resume never writes in place, as hard links).

Timed: the real command line (``python batch_runner.py ... --resume``) as a subprocess
against a real Prefect server, start to exit, plus the flow's own duration from ``run.json``;
model requests are counted at the mock server's ``/stats``, the command's peak RSS polled with
psutil. With ``--first-prompt-only`` (used for 10^6) the 1% resume is timed to its first model
request and then stopped as a user does (SIGTERM): running 10,000 prompts is not what is measured.

Usage: ``python bench/resume.py [--n 10000] [--json out.json] [--profile]``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import REPO, WORK, MockModel, PrefectServer, log, run_child, save_json, write_prompts  # noqa: E402

from flows.tuning import PREFECT_SERVER_SETTINGS  # noqa: E402
from hermes_core.runfolder.folder import BATCH_RE, TRAJECTORIES_FILE, RunFolder  # noqa: E402

MODEL = "mock/scripted?latency_ms=1000&turns=2"
DIST = "terminal_only"
BATCH_SIZE = 100
SEED_N = 20
RERUN_FRACTION = 0.01
SERVER_ENV = PREFECT_SERVER_SETTINGS  # the settings the product recommends (flows/tuning.py)
CACHE_RECORDS_UP_TO = 100_000


IDENTITY_SOURCES = (
    "flows/config.py",
    "hermes_core/dataset.py",
    "hermes_core/runfolder/ledger.py",
    "hermes_core/runfolder/run_info.py",
    "hermes_core/runner.py",
    "hermes_core/trajectory.py",
)
"""The code that decides prompt identities and the run folder's format: the cached runs are rebuilt when it changes."""


def code_fingerprint() -> str:
    """12 hex chars of the sha256 of :data:`IDENTITY_SOURCES`."""
    digest = hashlib.sha256()
    for name in IDENTITY_SOURCES:
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()[:12]


def cli_args(dataset: Path, run_name: str, output_dir: Path, base_url: str, workers: int) -> list[str]:
    """The command line of the run (the same defining settings every time)."""
    return [
        f"--dataset_file={dataset}",
        f"--batch_size={BATCH_SIZE}",
        f"--run_name={run_name}",
        f"--output_dir={output_dir}",
        f"--model={MODEL}",
        f"--base_url={base_url}",
        f"--distribution={DIST}",
        f"--num_workers={workers}",
    ]


def seed_run(root: Path, dataset: Path, mock: MockModel, server: PrefectServer) -> Path:
    """A real run of the first SEED_N prompts of ``dataset`` (the flow against the mock model)."""
    out = root / "seed"
    if out.exists():
        shutil.rmtree(out)
    config = {
        "dataset_file": str(dataset),
        "batch_size": BATCH_SIZE,
        "run_name": "seed",
        "output_dir": str(root),
        "model": MODEL,
        "base_url": mock.base_url,
        "distribution": DIST,
        "num_workers": SEED_N,
        "max_samples": SEED_N,
    }
    env = {"PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(root / "client-home")}
    child = run_child(["bench/_flow_child.py", json.dumps({"config": config})], env, root / "seed.log")
    if child.result["state"] != "COMPLETED":
        raise RuntimeError(f"seed run ended {child.result['state']}: {child.result['message']}")
    return out


def synthesise(runs: dict[Path, set[int]], dataset: Path, seed_dir: Path) -> dict[str, dict[str, Any]]:
    """Write, in one pass over ``dataset``, a finished run per ``{run_dir: missing}`` (``missing``: failed prompts).

    Returns counts per run folder name. Uses the product's ledger, run_setup and postprocess functions.
    """
    from flows.config import BatchConfig
    from flows.report import finish_run
    from hermes_core.dataset import read_dataset
    from hermes_core.runfolder.ledger import RunLedger
    from hermes_core.runfolder.run_info import iter_jobs, prompt_ids, start_invocation

    ds = read_dataset(dataset)
    cache_records = len(ds) <= CACHE_RECORDS_UP_TO
    templates = []
    for path in RunFolder(seed_dir).batch_files():
        templates += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    templates.sort(key=lambda r: r["prompt_index"])
    seed_cache = sorted(RunFolder(seed_dir).results.glob("hermes-prompt-*"))
    t0 = time.monotonic()
    open_runs = []
    for run_dir, missing in runs.items():
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        config = BatchConfig.from_options(
            dataset_file=str(dataset),
            batch_size=BATCH_SIZE,
            run_name=run_dir.name,
            output_dir=str(run_dir.parent),
            model=MODEL,
            distribution=DIST,
        )
        RunFolder(run_dir).results.mkdir()
        info = start_invocation(
            run_dir, config.run_name, config.defining_settings(), config.settings_hash(), ds, "synthesised"
        )
        ledger = RunLedger.open(run_dir, config.run_name)
        ids = prompt_ids(ds, config.settings_hash())
        index_of = {pid: i for i, pid in enumerate(ids)}
        ledger.plan(list(enumerate(ids)), BATCH_SIZE, index_of)
        open_runs.append((run_dir, missing, config, info, ledger, index_of, []))
    settings_hash = open_runs[0][2].settings_hash()
    real_fsync = os.fsync
    if not cache_records:
        os.fsync = lambda fd: None  # the synthesis only: the product's writes are unchanged
    try:
        for job in iter_jobs(ds, settings_hash):
            template = templates[job.prompt_index % len(templates)]
            row = copy.deepcopy(template)
            old_prompt = row["conversations"][1]["value"]
            row["prompt_index"] = job.prompt_index
            row["conversations"][1]["value"] = job.prompt
            for turn in row["conversations"][2:]:
                turn["value"] = turn["value"].replace(old_prompt, job.prompt)
            row["metadata"]["prompt_id"] = job.prompt_id
            row["metadata"]["source"] = job.source
            for run_dir, missing, _config, _info, ledger, _index_of, failed in open_runs:
                if job.prompt_index in missing:
                    ledger.record_failure(
                        job.prompt_id, job.prompt_index, "ModelError", "HTTP 503: synthesised", 2
                    )
                    failed.append(job.prompt_id)
                    continue
                ledger.record_row(job.prompt_id, copy.copy(row) | {"metadata": dict(row["metadata"])})
                if cache_records:  # one cache record per finished prompt, as a real run leaves (never read)
                    src = seed_cache[job.prompt_index % len(seed_cache)]
                    shutil.copyfile(src, RunFolder(run_dir).results / f"hermes-prompt-{job.prompt_id}")
    finally:
        os.fsync = real_fsync
    counts = {}
    for run_dir, _missing, config, info, ledger, index_of, failed in open_runs:
        ledger.write_checkpoint()
        ledger.close()
        stats = finish_run(
            config,
            info,
            index_of,
            failed,
            started=t0,
            facts={"ran": len(index_of), "failed": len(failed)},
            in_flow=False,
        )
        size = sum(p.stat().st_size for p in RunFolder(run_dir).batch_files())
        counts[run_dir.name] = {"rows": stats["completed"], "failed": len(failed), "batch_bytes": size}
    return counts


def _copy_run(cached: Path, run_dir: Path) -> None:
    """Copy a cached run folder; batch files and the merged file (never written in place) as hard links."""

    def link_or_copy(src: str, dst: str) -> None:
        name = os.path.basename(src)
        if BATCH_RE.match(name) or name == TRAJECTORIES_FILE:
            os.link(src, dst)
        else:
            shutil.copy2(src, dst)

    shutil.copytree(cached, run_dir, copy_function=link_or_copy)


def timed_resume(
    name: str,
    cached: Path,
    root: Path,
    dataset: Path,
    mock: MockModel,
    server: PrefectServer,
    workers: int,
    first_prompt_only: bool = False,
) -> dict[str, Any]:
    """Copy ``cached`` to a fresh run folder and time the real CLI with ``--resume`` on it.

    With ``first_prompt_only`` the command is stopped (SIGTERM) at its first model request.
    """
    runs = root / "runs"
    run_dir = runs / cached.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    _copy_run(cached, run_dir)
    mock.reset()
    env = {
        **os.environ,
        "PREFECT_API_URL": server.api_url,
        "PREFECT_HOME": str(root / "client-home"),
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "COLUMNS": "160",
    }
    args = cli_args(dataset, cached.name, runs, mock.base_url, workers) + ["--resume"]
    log_path = root / f"{name}.log"
    first_request_s = None
    peak_rss = 0.0
    t0 = time.perf_counter()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "batch_runner.py"), *args], cwd=root, env=env, stdout=out, stderr=out
        )
        ps = psutil.Process(proc.pid)
        polls = 0
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                peak_rss = max(peak_rss, ps.memory_info().rss / 2**20)
            polls += 1
            if first_request_s is None and polls % 5 == 0 and mock.requests() > 0:
                first_request_s = round(time.perf_counter() - t0, 2)
                if first_prompt_only:
                    proc.send_signal(signal.SIGTERM)
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    folder = RunFolder(run_dir)
    run_info = json.loads(folder.run_json.read_text())
    last = run_info["invocations"][-1]
    stats = json.loads(folder.statistics.read_text())
    return {
        "exit_code": proc.returncode,
        "cli_wall_s": round(wall, 2),
        "flow_duration_s": last.get("duration_s"),
        "ran": last.get("ran"),
        "model_requests": mock.requests(),
        "first_model_request_s": first_request_s,
        "stopped_at_first_request": first_prompt_only,
        "cli_peak_rss_mb": round(peak_rss, 1),
        "completed_after": stats["completed"],
    }


def profile_resume(cached: Path, root: Path, dataset: Path, mock: MockModel, server: PrefectServer) -> str:
    """The do-nothing resume's flow in bench/_flow_child.py under pyinstrument; returns the report path."""
    run_dir = root / "runs" / cached.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    _copy_run(cached, run_dir)
    config = {
        "dataset_file": str(dataset),
        "batch_size": BATCH_SIZE,
        "run_name": cached.name,
        "output_dir": str(root / "runs"),
        "model": MODEL,
        "base_url": mock.base_url,
        "distribution": DIST,
        "resume": True,
    }
    report = root / "resume-profile.txt"
    env = {"PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(root / "client-home")}
    run_child(
        ["bench/_flow_child.py", json.dumps({"config": config, "profile": str(report)})],
        env,
        root / "profile.log",
    )
    return str(report)


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the synthesised runs, time both resumes, print and save the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10_000, help="prompts of the finished run")
    p.add_argument("--workers", type=int, default=100, help="--num_workers of the resumes")
    p.add_argument("--rebuild", action="store_true", help="synthesise the runs again")
    p.add_argument(
        "--profile", action="store_true", help="also profile the do-nothing resume's flow (pyinstrument)"
    )
    p.add_argument(
        "--first-prompt-only",
        action="store_true",
        help="time the 1%% resume to its first model request, then stop it (for large --n)",
    )
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    root = WORK / "resume"
    cache = WORK / "resume-cache" / f"n{args.n}-{code_fingerprint()}"
    root.mkdir(parents=True, exist_ok=True)
    (root / "client-home").mkdir(exist_ok=True)
    dataset = cache / "prompts.jsonl"
    rerun = set(random.Random(11).sample(range(SEED_N, args.n), round(args.n * RERUN_FRACTION)))
    figures: dict[str, Any] = {"n": args.n, "batch_size": BATCH_SIZE, "rerun": len(rerun), "model": MODEL}
    with MockModel(root / "mock.log") as mock, PrefectServer(root / "server-home", env=SERVER_ENV) as server:
        done_marker = cache / "ready.json"
        if args.rebuild or not done_marker.exists():
            if cache.exists():
                shutil.rmtree(cache)
            write_prompts(dataset, args.n)
            log(f"seed run of {SEED_N} prompts")
            seed = seed_run(cache, dataset, mock, server)
            log(f"synthesising the finished run of {args.n} prompts and the one with {len(rerun)} failed")
            t0 = time.monotonic()
            built = synthesise(
                {cache / f"finished{args.n}": set(), cache / f"onepct{args.n}": rerun}, dataset, seed
            )
            save_json(
                done_marker,
                {
                    "finished": built[f"finished{args.n}"],
                    "one_percent": built[f"onepct{args.n}"],
                    "build_s": time.monotonic() - t0,
                },
            )
        built = json.loads(done_marker.read_text())
        figures["run_size_mb"] = round(built["finished"]["batch_bytes"] / 2**20, 1)
        log("resume of the finished run")
        figures["resume_nothing"] = timed_resume(
            "resume-nothing", cache / f"finished{args.n}", root, dataset, mock, server, args.workers
        )
        log(json.dumps(figures["resume_nothing"]))
        log("resume with 1% to re-run")
        figures["resume_one_percent"] = timed_resume(
            "resume-1pct",
            cache / f"onepct{args.n}",
            root,
            dataset,
            mock,
            server,
            args.workers,
            first_prompt_only=args.first_prompt_only,
        )
        log(json.dumps(figures["resume_one_percent"]))
        if args.profile:
            figures["profile"] = profile_resume(cache / f"finished{args.n}", root, dataset, mock, server)
            log(f"profile of the do-nothing resume: {figures['profile']}")
    a, b = figures["resume_nothing"], figures["resume_one_percent"]
    print(
        f"finished run: {args.n} prompts, {figures['run_size_mb']} MB of batch files, batch_size {BATCH_SIZE}"
    )
    print(
        f"--resume, nothing to do: {a['cli_wall_s']} s command line start to exit "
        f"(flow {a['flow_duration_s']} s), {a['model_requests']} model requests, exit {a['exit_code']}, "
        f"peak RSS {a['cli_peak_rss_mb']} MB"
    )
    print(
        f"--resume, {len(rerun)} to re-run (1%, {args.workers} workers, 3 x 1 s calls each): {b['cli_wall_s']} s "
        f"(flow {b['flow_duration_s']} s), {b['model_requests']} model requests, ran {b['ran']}, exit {b['exit_code']}, "
        f"first model request at {b['first_model_request_s']} s"
        f"{' (then stopped)' if b['stopped_at_first_request'] else ''}, peak RSS {b['cli_peak_rss_mb']} MB"
    )
    print(f"load average at the end: {[round(x, 2) for x in os.getloadavg()]}")
    if args.json:
        save_json(Path(args.json), figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
