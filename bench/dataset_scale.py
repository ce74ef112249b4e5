"""Dataset scale: a 1,000,000-record dataset through the real flow, up to its first prompts.

The dataset is synthesised (seeded): prompts of 200-2,000 characters (uniform), every record with
a ``task_id`` field, 3% of the records exact copies of an earlier one (duplicates get their own
identity by occurrence). It is cached under ``$HERMES_BENCH_DIR/dataset-cache``.

Measured, each in a fresh child process:

* ``read``: :func:`hermes_core.dataset.read_dataset` + :func:`hermes_core.runfolder.run_info.prompt_ids` alone
  (reading, validation, identity), wall seconds and peak RSS;
* ``flow``: the real flow (bench/_flow_child.py, patch ``first_prompt``) against the mock model and
  a Prefect server, W workers: seconds from the flow call to the first prompt's start (reading,
  validation, identity, ledger, planning, Prefect's task runs) and the peak RSS then; the RSS every
  250 finished prompts while the sliding window runs; then the run is stopped as a user does
  (SIGTERM) after ``--stop-after`` prompts: it records what finished and ends Cancelled.

Usage: ``python bench/dataset_scale.py [--n 1000000] [--workers 256] [--stop-after 1500] [--json out]``.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import WORK, MockModel, PrefectServer, emit, log, peak_rss_mb, run_child, save_json  # noqa: E402

from flows.tuning import PREFECT_SERVER_SETTINGS  # noqa: E402

DUPLICATE_FRACTION = 0.03
MIN_CHARS, MAX_CHARS = 200, 2000
MODEL = "mock/scripted?latency_ms=200&turns=2"


def write_dataset(path: Path, n: int, seed: int = 5) -> dict[str, Any]:
    """Write ``n`` records (see the module docstring); returns its size and duplicate count."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(5000)]
    text = " ".join(rng.choices(words, k=400_000))  # a long text to cut prompts from
    path.parent.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    duplicates = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for i in range(n):
            if written and rng.random() < DUPLICATE_FRACTION:
                line = written[rng.randrange(len(written))]
                duplicates += 1
            else:
                size = rng.randint(MIN_CHARS, MAX_CHARS)
                start = rng.randrange(len(text) - size)
                line = json.dumps({"prompt": f"Task {i}: {text[start : start + size]}", "task_id": i})
                if len(written) < 10_000:
                    written.append(line)
                elif rng.random() < 0.01:
                    written[rng.randrange(len(written))] = line
            fh.write(line + "\n")
    tmp.rename(path)
    return {"records": n, "duplicates": duplicates, "mb": round(path.stat().st_size / 2**20, 1)}


def child_read(dataset: str) -> None:
    """Child mode: read the dataset and compute its identities; print the figures."""
    t0 = time.perf_counter()
    from hermes_core.dataset import read_dataset
    from hermes_core.runfolder.run_info import prompt_ids

    ds = read_dataset(dataset)
    t_read = time.perf_counter() - t0
    ids = prompt_ids(ds, "0" * 16)
    wall = time.perf_counter() - t0
    emit(
        {
            "records": len(ds),
            "read_s": round(t_read, 2),
            "read_and_identity_s": round(wall, 2),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "distinct_ids": len(set(ids)),
        }
    )


def main(argv: list[str] | None = None) -> int:
    """Synthesise (or reuse) the dataset, measure reading and the flow's set-up, print and save the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=256)
    p.add_argument("--stop-after", type=int, default=1500, help="stop the flow after this many prompts")
    p.add_argument("--json", default=None)
    p.add_argument("--child-read", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_read:
        child_read(args.child_read)
        return 0
    root = WORK / "dataset-scale"
    root.mkdir(parents=True, exist_ok=True)
    dataset = WORK / "dataset-cache" / f"n{args.n}-d{DUPLICATE_FRACTION}.jsonl"
    figures: dict[str, Any] = {"n": args.n, "workers": args.workers, "model": MODEL}
    if not dataset.exists():
        log(f"writing a dataset of {args.n} records")
        t0 = time.monotonic()
        figures["dataset"] = write_dataset(dataset, args.n)
        log(f"written in {time.monotonic() - t0:.1f} s: {figures['dataset']}")
    figures["dataset_mb"] = round(dataset.stat().st_size / 2**20, 1)
    log("read + identity in a child")
    read = run_child(["bench/dataset_scale.py", "--child-read", str(dataset)], {}, root / "read.log")
    figures["read"] = read.result
    log(json.dumps(read.result))
    with (
        MockModel(root / "mock.log") as mock,
        PrefectServer(root / "server-home", env=PREFECT_SERVER_SETTINGS) as server,
    ):
        run_dir = root / "runs"
        config = {
            "dataset_file": str(dataset),
            "batch_size": 100,
            "run_name": "scale",
            "distribution": "terminal_only",
            "model": MODEL,
            "base_url": mock.base_url,
            "num_workers": args.workers,
            "output_dir": str(run_dir),
            "overwrite": True,
        }
        env = {
            "PREFECT_API_URL": server.api_url,
            "PREFECT_HOME": str(root / "client-home"),
            "HERMES_BENCH_STOP_AFTER": str(args.stop_after),
        }
        log(f"flow: {args.workers} workers, stopped after {args.stop_after} prompts")
        t0 = time.monotonic()
        flow = run_child(
            ["bench/_flow_child.py", json.dumps({"config": config, "patches": ["first_prompt"]})],
            env,
            root / "flow.log",
        )
        figures["flow"] = {**flow.result, "child_wall_s": round(time.monotonic() - t0, 1)}
    figures["load_average"] = [round(x, 2) for x in __import__("os").getloadavg()]
    f = figures["flow"]
    print(f"dataset: {args.n} records, {figures['dataset_mb']} MB")
    print(
        f"read + validate: {read.result['read_s']} s; + identities: {read.result['read_and_identity_s']} s, "
        f"peak RSS {read.result['peak_rss_mb']} MB"
    )
    print(
        f"flow: first prompt started {f.get('first_prompt_s')} s after the flow call, peak RSS then "
        f"{f.get('peak_rss_first_prompt_mb')} MB; RSS by prompts done {f.get('rss_by_done_mb')}; "
        f"ended {f['state']} ({f['message']}); load {figures['load_average']}"
    )
    if args.json:
        save_json(Path(args.json), figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
