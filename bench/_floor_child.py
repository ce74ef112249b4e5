"""Child process: Prefect's own floor, a flow of N trivial tasks (each sleeps ``sleep_s``) on W threads.

Usage: ``python bench/_floor_child.py '{"n": 512, "workers": 64, "sleep_s": 0.2, "persist": false,
"like_prompt": false, "exit_file": "..."}'`` with ``PREFECT_API_URL`` set. ``like_prompt``: the
trivial task gets the prompt task's Prefect options (``cache_key_fn``, a zlib-compressed pickle
result in a result folder of its own, ``task_run_name`` from a parameter, retries with a retry
condition) and returns a row of ~11 KB like a trajectory row: what those Prefect features cost,
without the agent. ``with_core`` (a bench/_core_child.py spec): the agent core's workload on the
same prompts runs in this process at the same time, on its own W threads, so the flow's Prefect
machinery shares one GIL with the agent as in a real flow run; ``flow_cpu_s`` then counts both
(its warm-up prompts run before the clock starts). Prints ``BENCH_RESULT {json}`` like
bench/_flow_child.py: the per-task CPU that Prefect itself costs, whatever the task does.
"""

from __future__ import annotations

import atexit
import json
import resource
import sys
import time

_FINAL: dict = {}


def _at_exit() -> None:  # registered before Prefect is imported: runs after its exit handlers
    if _FINAL.get("exit_file"):
        with open(_FINAL["exit_file"], "w") as fh:
            json.dump(
                {
                    "cpu_at_exit": time.process_time(),
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                },
                fh,
            )


def main() -> None:
    atexit.register(_at_exit)
    spec = json.loads(sys.argv[1])
    _FINAL["exit_file"] = spec.get("exit_file")
    t_import = time.perf_counter()
    from prefect import flow, task
    from prefect.task_runners import ThreadPoolTaskRunner

    import_s = time.perf_counter() - t_import
    sleep_s = spec.get("sleep_s", 0.2)

    if spec.get("like_prompt"):
        import hashlib
        import os
        import tempfile
        from pathlib import Path

        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from tasks.prompt import run_prompt_task  # the product's task: its serializer, retries, condition

        row = {"conversations": [{"from": "gpt", "value": "x" * 200} for _ in range(50)], "metadata": {}}

        def key(context, parameters):
            return "floor-" + hashlib.sha256(f"{parameters['i']}|{time.time_ns()}".encode()).hexdigest()[:32]

        def like_prompt(i: int) -> dict:
            time.sleep(sleep_s)
            return {**row, "prompt_index": i}

        noop = task(
            like_prompt,
            name="noop",
            task_run_name="noop-{i}",
            cache_key_fn=key,
            persist_result=True,
            result_serializer=run_prompt_task.result_serializer,
            result_storage=Path(tempfile.mkdtemp(prefix="floor-results-")),
            retries=run_prompt_task.retries,
            retry_condition_fn=run_prompt_task.retry_condition_fn,
        )

    else:

        @task(name="noop", persist_result=spec.get("persist", False))
        def noop(i: int) -> int:
            time.sleep(sleep_s)
            return i

    @flow(
        name="prefect-floor",
        task_runner=ThreadPoolTaskRunner(max_workers=spec["workers"]),
        persist_result=False,
    )
    def floor(n: int) -> int:
        futures = noop.map(range(n))
        return sum(1 for f in futures if f.result() is not None)

    background = None
    if spec.get("with_core"):
        import threading

        from _core_child import AgentCore

        core = AgentCore(spec["with_core"])
        core.warm_up()
        background = threading.Thread(target=core.run, name="agent-core")
    from _common import GcTime

    gc_time = GcTime().install()
    cpu0, t0 = time.process_time(), time.perf_counter()
    if background is not None:
        background.start()
    floor(spec["n"])
    wall = time.perf_counter() - t0
    if background is not None:
        background.join()
    cpu = time.process_time() - cpu0
    from _common import emit

    emit(
        {
            "import_s": round(import_s, 3),
            "flow_wall_s": round(wall, 3),
            "flow_cpu_s": round(cpu, 3),
            "cpu_before_flow_s": round(cpu0, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "state": "COMPLETED",
            "message": "",
            **gc_time.figures(),
        }
    )


if __name__ == "__main__":
    main()
