"""Child process: the agent core alone, the work a prompt does without any orchestration.

The same prompts and run settings as a flow run of bench/throughput.py go through
:func:`hermes_core.runner.run_prompt` on a plain ``ThreadPoolExecutor`` of W threads in this one
process: no Prefect task, no ledger, no progress, no result persistence (the process's garbage
collector tuned as the flow tunes its own, :func:`flows.tuning.tune_garbage_collector`). Its CPU per prompt is
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


class AgentCore:
    """The agent core's workload: ``config``'s prompts through ``run_prompt`` on W plain threads.

    :meth:`warm_up` runs the first ``warmup`` prompts (not counted), :meth:`run` the others and
    returns how many failed. Used alone by this child and, in bench/_floor_child.py
    (``with_core``), beside Prefect's floor in one process. The process's garbage collector is
    tuned as the flow process tunes its own.
    """

    def __init__(self, spec: dict) -> None:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from flows.config import BatchConfig
        from flows.tuning import tune_garbage_collector
        from hermes_core.dataset import read_dataset
        from hermes_core.runfolder.run_info import iter_jobs
        from hermes_core.runner import run_prompt
        from hermes_core.settings import HermesSettings

        tune_garbage_collector()  # as the flow process tunes its own at its start
        config = BatchConfig.from_options(**spec["config"])
        self._run_prompt = run_prompt
        self._spec = config.run_spec().model_copy(update={"run_id": "bench-core"})
        self._settings = HermesSettings()
        self.jobs = list(iter_jobs(read_dataset(config.dataset_file), config.settings_hash()))
        self.warmup = int(spec.get("warmup", 4))
        self.workers = config.num_workers

    def _one(self, job) -> bool:
        try:
            self._run_prompt(job, self._spec, self._settings)
            return True
        except Exception:  # noqa: BLE001 - counted; the bench reports it
            return False

    def warm_up(self) -> None:
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(self._one, self.jobs[: self.warmup]))

    def run(self) -> int:
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return sum(not ok for ok in pool.map(self._one, self.jobs[self.warmup :]))


def main() -> None:
    core = AgentCore(json.loads(sys.argv[1]))
    core.warm_up()
    cpu0, t0 = time.process_time(), time.perf_counter()
    failed = core.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    from _common import emit

    emit(
        {
            "core_wall_s": round(wall, 3),
            "core_cpu_s": round(cpu, 3),
            "prompts": len(core.jobs) - core.warmup,
            "failed": failed,
        }
    )


if __name__ == "__main__":
    main()
