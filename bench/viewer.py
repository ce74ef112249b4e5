"""The viewer on a 100,000-prompt run: index build time, page latencies, peak RSS.

The run folder is synthesised as ``bench/resume.py`` does it (its ``seed_run`` and
``synthesise``: a real 20-prompt seed run through the flow against the mock model, then every
other prompt a copy of a seed row with its own identity, written by ``hermes_core.runfolder.ledger.RunLedger``,
merged and counted by ``hermes_core.runfolder.postprocess``), with 1% of the prompts failed (a failure line, no
row). ``os.fsync`` is a no-op while synthesising (the bytes are the same; only durability,
irrelevant to a benchmark fixture, is lost), which cuts the build from ~100,000 fsyncs. The
folder is cached under ``$HERMES_BENCH_DIR/viewer-cache``.

Timed: the real command (``python -m flows.cli view RUN --port P``) in a child process: start to
first answer with no index (cold: the index is built) and with the cached index (warm); then
every page below ``--repeat`` times over HTTP (median and max, milliseconds); then the child's
peak RSS (``VmHWM``).

Usage: ``python bench/viewer.py [--n 100000] [--repeat 5] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from _common import REPO, WORK, MockModel, PrefectServer, free_port, log, save_json, write_prompts  # noqa: E402
from resume import SERVER_ENV, code_fingerprint, seed_run, synthesise  # noqa: E402

from hermes_core.runfolder.folder import RunFolder  # noqa: E402


def pages(n: int) -> dict[str, str]:
    """The timed pages: name -> path."""
    return {
        "run page (first 50)": "/",
        "run page, last page": f"/?page={n // 50}",
        "filter status=failed": "/?status=failed",
        "filter tool + tool errors": "/?tool=terminal&tool_errors=1",
        "text search": f"/?q=Task+{n - 7}:",
        "trajectory, first": "/prompt/0",
        "trajectory, middle": f"/prompt/{n // 2}",
        "trajectory, last": f"/prompt/{n - 1}",
        "trajectory, failed": None,  # filled with a failed prompt's index
    }


def build(n: int) -> Path:
    """The cached run folder of ``n`` prompts (built once)."""
    cache = WORK / "viewer-cache" / f"n{n}-{code_fingerprint()}"
    run_dir = cache / f"run{n}"
    marker = cache / "ready.json"
    if marker.exists():
        return run_dir
    if cache.exists():
        shutil.rmtree(cache)
    dataset = cache / "prompts.jsonl"
    write_prompts(dataset, n)
    failed = set(random.Random(3).sample(range(20, n), n // 100))
    with (
        MockModel(cache / "mock.log") as mock,
        PrefectServer(cache / "server-home", env=SERVER_ENV) as server,
    ):
        (cache / "client-home").mkdir(exist_ok=True)
        log("seed run of 20 prompts through the flow")
        seed = seed_run(cache, dataset, mock, server)
    log(f"synthesising {n} prompts ({len(failed)} failed) with the ledger")
    real_fsync = os.fsync
    os.fsync = lambda fd: None
    try:
        t0 = time.monotonic()
        counts = synthesise(run_dir, dataset, seed, failed)
    finally:
        os.fsync = real_fsync
    shutil.rmtree(RunFolder(run_dir).results, ignore_errors=True)  # the viewer never reads the cache
    save_json(
        marker, {**counts, "failed_indices": sorted(failed), "build_s": round(time.monotonic() - t0, 1)}
    )
    return run_dir


def vm_hwm_mb(pid: int) -> float:
    """Peak resident memory of a process, MB (``VmHWM`` of /proc/<pid>/status)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", text).group(1)) / 1024


def start_viewer(run_dir: Path, port: int) -> tuple[subprocess.Popen, float]:
    """Start the command; returns it and the seconds until ``/`` answered."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "view", str(run_dir), f"--port={port}"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200:
                return proc, time.perf_counter() - t0
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError(f"viewer exited: {proc.stderr.read()[-2000:]}") from None
            time.sleep(0.1)


def stop_viewer(proc: subprocess.Popen) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    return err


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the run, time the viewer, print and save the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000, help="prompts of the run")
    p.add_argument("--repeat", type=int, default=5, help="requests per page")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    run_dir = build(args.n)
    ready = json.loads((run_dir.parent / "ready.json").read_text())
    folder = RunFolder(run_dir)
    size_mb = sum(f.stat().st_size for f in folder.batch_files()) / 2**20
    for cached in (folder.view_index, folder.view_index_meta):
        cached.unlink(missing_ok=True)
    port = free_port()
    figures: dict[str, Any] = {"n": args.n, "batch_mb": round(size_mb, 1), "failed": ready["failed"]}

    log("cold start (index built)")
    proc, cold = start_viewer(run_dir, port)
    targets = pages(args.n)
    targets["trajectory, failed"] = f"/prompt/{ready['failed_indices'][0]}"
    latencies = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        for name, path in targets.items():
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                answer = client.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                if answer.status_code != 200:
                    raise RuntimeError(f"{path}: HTTP {answer.status_code}")
            latencies[name] = {
                "path": path,
                "median_ms": round(statistics.median(times), 1),
                "max_ms": round(max(times), 1),
            }
            log(f"{name}: {latencies[name]}")
    figures["peak_rss_mb"] = round(vm_hwm_mb(proc.pid), 1)
    err = stop_viewer(proc)
    built = re.search(r"index of (\d+) prompts built in ([\d.]+) s", err)
    figures["index_build_s"] = float(built.group(2)) if built else None
    figures["cold_start_s"] = round(cold, 2)
    figures["index_mb"] = round(folder.view_index.stat().st_size / 2**20, 1)

    log("warm start (cached index)")
    proc, warm = start_viewer(run_dir, port)
    figures["warm_peak_rss_mb"] = round(vm_hwm_mb(proc.pid), 1)
    err = stop_viewer(proc)
    figures["warm_start_s"] = round(warm, 2)
    figures["warm_from_cache"] = "from its cache" in err
    figures["pages"] = latencies

    print(f"run: {args.n} prompts, {figures['batch_mb']} MB of batch files, {ready['failed']} failed")
    print(
        f"index build {figures['index_build_s']} s (cold start to first page {figures['cold_start_s']} s); "
        f"cached index {figures['index_mb']} MB, warm start {figures['warm_start_s']} s"
    )
    for name, value in latencies.items():
        print(
            f"{name:28s} {value['path']:32s} median {value['median_ms']:7.1f} ms  max {value['max_ms']:7.1f} ms"
        )
    print(f"viewer peak RSS {figures['peak_rss_mb']} MB (warm start: {figures['warm_peak_rss_mb']} MB)")
    if args.json:
        save_json(Path(args.json), figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
