"""Child process: the agent core alone, the work a prompt does without any orchestration.

The same prompts and run settings as a flow run of bench/throughput.py go through
:func:`hermes_core.runner.run_prompt` on a plain ``ThreadPoolExecutor`` of W threads in this one
process: no Prefect task, no ledger, no progress, no result persistence. Its CPU per prompt is
what the flow process would spend if orchestration were free, so ``flow + server - core`` is
the orchestration's own cost, comparable with Prefect's floor per task (bench/_floor_child.py).

Usage: ``python bench/_core_child.py '{"config": {BatchConfig fields}, "warmup": 4}'`` (no
Prefect API is used). The first ``warmup`` prompts run first and are not counted (one-time
imports, the first HTTP client). Prints ``BENCH_RESULT {json}`` with ``core_wall_s``,
``core_cpu_s`` (this process, all threads, not its children), ``prompts``, ``failed``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    spec = json.loads(sys.argv[1])
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from flows.config import BatchConfig
    from hermes_core.runner import run_prompt
    from hermes_core.settings import HermesSettings
    from tasks.dataset import read_dataset
    from tasks.run_setup import iter_jobs

    config = BatchConfig.from_options(**spec["config"])
    run_spec = config.run_spec().model_copy(update={"run_id": "bench-core"})
    settings = HermesSettings()
    dataset = read_dataset(config.dataset_file)
    jobs = list(iter_jobs(dataset, config.settings_hash()))
    warmup = int(spec.get("warmup", 4))
    failed = 0

    def one(job) -> bool:
        try:
            run_prompt(job, run_spec, settings)
            return True
        except Exception:  # noqa: BLE001 - counted; the bench reports it
            return False

    with ThreadPoolExecutor(max_workers=config.num_workers) as pool:
        list(pool.map(one, jobs[:warmup]))
        cpu0, t0 = time.process_time(), time.perf_counter()
        failed = sum(not ok for ok in pool.map(one, jobs[warmup:]))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    from _common import emit

    emit(
        {
            "core_wall_s": round(wall, 3),
            "core_cpu_s": round(cpu, 3),
            "prompts": len(jobs) - warmup,
            "failed": failed,
        }
    )


if __name__ == "__main__":
    main()
