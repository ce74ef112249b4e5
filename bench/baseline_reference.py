"""The reference's execution model, written minimally, as the baseline of the throughput benchmark.

The reference ``batch_runner.py`` splits the dataset into fixed batches of ``batch_size``
prompts and hands them to ``multiprocessing.Pool(num_workers).map``; each worker runs its
batch's prompts one after another and appends each row to ``batch_<n>.jsonl``. A slow prompt
therefore stalls the rest of its batch, and a worker with no batch left stays idle.

Here each prompt goes through the same agent core as the product (:func:`hermes_core.run_prompt`,
same mock model, same sandbox and tools); only the scheduling differs. No Prefect.

Usage (child process of bench/throughput.py)::

    python bench/baseline_reference.py '{"dataset": "p.jsonl", "out_dir": "...", "num_workers": 16,
        "batch_size": 10, "model": "mock/scripted?latency_ms=1000", "base_url": "http://.../v1",
        "distribution": "terminal_only"}'

Prints ``BENCH_RESULT {json}``: wall seconds (pool start to last batch), prompts done, CPU
seconds of the parent and of the pool workers (their own, not the tool subprocesses).
"""

from __future__ import annotations

import json
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hermes_core import ModelOptions, PromptJob, RunSpec, run_prompt  # noqa: E402
from hermes_core.runfolder.folder import RunFolder  # noqa: E402
from hermes_core.settings import HermesSettings  # noqa: E402


def process_batch(args: tuple[int, list[dict[str, Any]], str, dict[str, Any]]) -> dict[str, Any]:
    """Run one batch's prompts sequentially (the reference's ``_process_batch_worker``).

    Returns ``{"batch_num", "processed", "failed", "cpu_s"}``; ``cpu_s`` is this worker's own CPU
    time spent on the batch (``time.process_time``, tool subprocesses excluded).
    """
    batch_num, jobs, out_dir, spec_data = args
    cpu0 = time.process_time()
    spec = RunSpec.model_validate(spec_data)
    settings = HermesSettings()
    processed = failed = 0
    path = RunFolder(out_dir).batch(batch_num)
    for data in jobs:
        try:
            outcome = run_prompt(PromptJob.model_validate(data), spec, settings)
        except Exception as exc:  # noqa: BLE001 - the reference logs and goes on
            failed += 1
            print(f"prompt {data['prompt_index']} failed: {exc}", file=sys.stderr)
            continue
        outcome.row["metadata"]["batch_num"] = batch_num
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(outcome.row, ensure_ascii=False) + "\n")
        processed += 1
    return {
        "batch_num": batch_num,
        "processed": processed,
        "failed": failed,
        "cpu_s": time.process_time() - cpu0,
    }


def run_baseline(
    prompts: list[str],
    *,
    out_dir: Path,
    num_workers: int,
    batch_size: int,
    spec: RunSpec,
) -> dict[str, Any]:
    """Run ``prompts`` the reference's way; returns wall seconds, counts and CPU seconds."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [
        PromptJob(
            prompt_index=i, prompt_id=f"baseline-{i:08d}", record_key=f"baseline-{i:08d}", prompt=p
        ).model_dump()
        for i, p in enumerate(prompts)
    ]
    batches = [jobs[i : i + batch_size] for i in range(0, len(jobs), batch_size)]
    tasks = [(n, batch, str(out_dir), spec.model_dump()) for n, batch in enumerate(batches)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    with Pool(processes=num_workers) as pool:
        results = pool.map(process_batch, tasks)
    wall = time.perf_counter() - t0
    return {
        "wall_s": round(wall, 3),
        "batches": len(batches),
        "processed": sum(r["processed"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "workers_cpu_s": round(sum(r["cpu_s"] for r in results), 3),
        "parent_cpu_s": round(time.process_time() - cpu0, 3),
    }


def main() -> None:
    """Child-process entry: read the JSON argument, run, print the result line."""
    args = json.loads(sys.argv[1])
    with open(args["dataset"], encoding="utf-8") as fh:
        prompts = [json.loads(line)["prompt"] for line in fh if line.strip()]
    spec = RunSpec(
        run_name="baseline",
        distribution=args.get("distribution", "terminal_only"),
        model=ModelOptions(model=args["model"]),
        base_url=args["base_url"],
    )
    result = run_baseline(
        prompts,
        out_dir=Path(args["out_dir"]),
        num_workers=args["num_workers"],
        batch_size=args["batch_size"],
        spec=spec,
    )
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import emit

    emit(result)


if __name__ == "__main__":
    main()
