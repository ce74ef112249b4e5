"""Child process of the benchmarks: one run of the real ``generate-trajectories`` flow, in-process.

Usage: ``python bench/_flow_child.py '<json>'`` with ``PREFECT_API_URL`` pointing at the server and
the JSON object::

    {"config": {BatchConfig fields},
     "exit_file": path,      # written at exit: CPU seconds, peak RSS, CPU of reaped tool subprocesses
     "profile": null | "x.html" | "x.txt" (pyinstrument, main thread) | "x.prof" (cProfile, as text),
     "patches": [names],     # experiments on a private copy, see apply_patches
     "tracemalloc": path,    # snapshot of live Python allocations after the flow
     "census": path,         # live objects by type after the flow
     "heartbeats": true}     # false: no flow-run heartbeats (as the command line with its own local API)

Prints ``BENCH_RESULT {json}``: import seconds, the flow's wall and CPU seconds (this process, all
threads, not its children), peak RSS (also when the merge starts: the prompt phase), final state.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys
import time
from pathlib import Path

_T_START = time.perf_counter()
_FINAL: dict = {}


def _at_exit() -> None:  # registered first, so it runs after Prefect's own exit handlers
    path = _FINAL.get("exit_file")
    if path:
        with open(path, "w") as fh:
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            own = resource.getrusage(resource.RUSAGE_SELF)
            json.dump(
                {
                    "cpu_at_exit": time.process_time(),
                    "user_s": own.ru_utime,
                    "system_s": own.ru_stime,
                    "peak_rss_mb": _peak_mb(),
                    "children_cpu_s": children.ru_utime + children.ru_stime,
                },
                fh,
            )


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _mark_prompt_phase_end() -> None:
    """Record the peak RSS reached when the merge starts: the peak of the prompt phase (bookkeeping only)."""
    import tasks.merge as merge_module

    inner = merge_module.merge_trajectories

    def merge_trajectories(*a, **kw):
        _FINAL.setdefault("peak_rss_prompt_phase_mb", _peak_mb())
        return inner(*a, **kw)

    merge_module.merge_trajectories = merge_trajectories


def apply_patches(names: list[str]) -> None:
    """Experiments on a private copy of the product's behaviour (never written to the product's files).

    * ``pickle``: the prompt task's result serializer plain ``pickle`` (no compression).
    * ``nocache``: the prompt task's results are not kept in Prefect's in-memory result cache.
    * ``switch1ms``: ``sys.setswitchinterval(0.001)`` (the GIL is handed over after 1 ms, not 5).
    * ``gcdefault``: the flow does not tune the garbage collector (its thresholds look set by the user).
    * ``ledger_nosync``: the ledger appends rows without fsync (an upper bound, not a proposal).
    * ``timeline``: record the start and end of every ``run_prompt`` and the flow dispatcher's steps.
    * ``sdk_pool``: the model client with the OpenAI SDK's default connection pool (1,000
      connections, 100 kept alive) instead of :data:`hermes_core.client.CONNECTION_LIMITS`.
    * ``noheartbeat``: the flow run sends no heartbeats (:func:`flows.tuning.without_flow_heartbeats`,
      what the command line does with its own local API); same as ``"heartbeats": false``.
    * ``first_prompt``: record the seconds from the flow call and the peak RSS when the first prompt
      starts, the RSS (now, not peak) after every ``HERMES_BENCH_RSS_EVERY`` (default 250) prompts, and
      stop the run the way a user does (SIGTERM to this process) after ``HERMES_BENCH_STOP_AFTER``
      prompts (unset: never): the set-up and the prompt phase of a large dataset without running it all.
    * ``eager_network``: an ``outbound`` bubblewrap sandbox gets its network (slirp4netns and routes)
      before its first command, as before network on demand, instead of at the first network socket
      of a command (the native agent is not asked for ``net-on-demand``).
    * ``cli_console``: the flow runs under the command line's console (:class:`flows.console.LiveProgress`:
      Prefect's per-task console lines off, a summary line every 10 s), as ``batch_runner.py`` runs it;
      without it Prefect prints its own console line for every task run, as in a worker's flow run.

    Experiments adopted by the product since (bench/ANALYSIS.md F2-F4: zlib results, raw
    ``client.post``, malloc arenas; the garbage collector's freeze and thresholds) are gone; malloc arena counts are set with ``MALLOC_ARENA_MAX``
    in ``--child-env``.
    """
    import flows.dispatch as dispatch

    if "eager_network" in names:
        import hermes_core.environments.bwrap as bwrap_mod

        plain_init = bwrap_mod.BwrapSandbox.__init__

        def eager_init(self, *args, **kwargs):
            plain_init(self, *args, **kwargs)
            self._native = False  # start() asks only the native agent for net-on-demand

        bwrap_mod.BwrapSandbox.__init__ = eager_init
    if "switch1ms" in names:
        sys.setswitchinterval(0.001)
    if "gcdefault" in names:  # thresholds "set by the user": the flow leaves Python's collector as it is
        import gc

        gc.set_threshold(701, 10, 10)
    if "ledger_nosync" in names:  # upper bound of what taking fsync off the dispatcher could give
        import hermes_core.runfolder.ledger as ledger_mod

        def append_nosync(fh, obj):
            fh.write((json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8"))

        ledger_mod.append_jsonl = append_nosync
    if "timeline" in names:  # record (start, end) of every run_prompt call: where the slots' time goes
        import atexit as _atexit

        import hermes_core.runner as runner_mod
        import tasks.prompt as prompt_mod

        spans: list[tuple[float, float]] = []
        inner = runner_mod.run_prompt

        def timed_run_prompt(*a, **kw):
            t0 = time.monotonic()
            try:
                return inner(*a, **kw)
            finally:
                spans.append((t0, time.monotonic()))

        prompt_mod.run_prompt = timed_run_prompt
        # time spent by the flow's dispatcher thread in each step of handling a completion
        from prefect.futures import PrefectConcurrentFuture

        import flows.progress as progress_mod
        from hermes_core.runfolder.ledger import RunLedger

        steps: dict[str, list[float]] = {}

        def timing(owner, attr, label):
            original = getattr(owner, attr)

            def wrapper(*a, **kw):
                t0 = time.perf_counter()
                try:
                    return original(*a, **kw)
                finally:
                    steps.setdefault(label, []).append(time.perf_counter() - t0)

            setattr(owner, attr, wrapper)

        timing(RunLedger, "record_row", "ledger.record_row")
        timing(progress_mod.RunProgress, "record", "progress.record")
        timing(PrefectConcurrentFuture, "wait", "future.wait")
        from hermes_core.client import ModelClient
        from hermes_core.environments.local import LocalEnvironment

        timing(ModelClient, "complete", "model.complete")  # in the prompt threads
        timing(LocalEnvironment, "execute", "local.execute")
        timing(LocalEnvironment, "start", "local.start")
        timing(LocalEnvironment, "close", "local.close")
        path = os.environ.get("HERMES_BENCH_TIMELINE", "timeline.json")
        _atexit.register(lambda: Path(path).write_text(json.dumps({"spans": spans, "steps": steps})))

    if "sdk_pool" in names:
        import openai._constants

        import hermes_core.client as client_mod

        client_mod.CONNECTION_LIMITS = openai._constants.DEFAULT_CONNECTION_LIMITS
    if "first_prompt" in names:
        import signal
        import threading

        import hermes_core.runner as runner_mod
        import tasks.prompt as prompt_mod

        inner_run = runner_mod.run_prompt
        stop_after = int(os.environ.get("HERMES_BENCH_STOP_AFTER") or 0)
        every = int(os.environ.get("HERMES_BENCH_RSS_EVERY") or 250)
        lock = threading.Lock()
        counts = {"done": 0}
        _FINAL["rss_by_done_mb"] = {}

        def first_prompt_run(*a, **kw):
            with lock:
                if "first_prompt_s" not in _FINAL:
                    _FINAL["first_prompt_s"] = round(time.perf_counter() - _FINAL["flow_t0"], 3)
                    _FINAL["peak_rss_first_prompt_mb"] = round(_peak_mb(), 1)
            try:
                return inner_run(*a, **kw)
            finally:
                with lock:
                    counts["done"] += 1
                    done = counts["done"]
                if done % every == 0:
                    _FINAL["rss_by_done_mb"][done] = round(_rss_now_mb(), 1)
                if stop_after and done == stop_after:
                    os.kill(os.getpid(), signal.SIGTERM)

        prompt_mod.run_prompt = first_prompt_run
    if "pickle" in names:
        dispatch.run_prompt_task = dispatch.run_prompt_task.with_options(result_serializer="pickle")
    if "nocache" in names:
        dispatch.run_prompt_task = dispatch.run_prompt_task.with_options(cache_result_in_memory=False)


def _shared_limit_calls() -> dict:
    """``{"shared_limit_calls": {...}}`` when prompts held slots of a --concurrency_limit, else ``{}``."""
    module = sys.modules.get("tasks.shared_limit")
    calls = module.server_calls() if module is not None else {}
    return {"shared_limit_calls": calls} if any(calls.values()) else {}


def main() -> None:
    atexit.register(_at_exit)
    spec = json.loads(sys.argv[1])
    _FINAL["exit_file"] = spec.get("exit_file")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from flows.config import BatchConfig
    from flows.generate import generate_trajectories

    import_s = time.perf_counter() - _T_START
    # patches also from the environment, for the parts that take no --experiments (e.g. memory)
    patches = (spec.get("patches") or []) + os.environ.get("HERMES_BENCH_PATCHES", "").split(",")
    apply_patches(patches)
    _mark_prompt_phase_end()
    config = BatchConfig.from_options(**spec["config"])
    profile = spec.get("profile")
    profiler = None
    pyinstrument = bool(profile) and profile.endswith((".html", ".txt"))
    if pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.005, async_mode="disabled")
        profiler.start()
    elif profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    trace = spec.get("tracemalloc")
    if trace:
        import tracemalloc

        tracemalloc.start(8)
    from _common import GcTime

    gc_time = GcTime().install()
    cpu0, t0 = time.process_time(), time.perf_counter()
    _FINAL["flow_t0"] = t0
    import contextlib

    from flows.tuning import without_flow_heartbeats

    heartbeats = spec.get("heartbeats", True) and "noheartbeat" not in patches
    from flows.console import LiveProgress

    console = LiveProgress() if "cli_console" in patches else contextlib.nullcontext()
    with console, contextlib.nullcontext() if heartbeats else without_flow_heartbeats():
        state = generate_trajectories(**config.options(), return_state=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    census = spec.get("census")
    if census:  # live objects by type after the flow (what a longer run keeps per prompt)
        import gc
        from collections import Counter

        gc.collect()
        counts: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        for obj in gc.get_objects():
            name = f"{type(obj).__module__}.{type(obj).__qualname__}"
            counts[name] += 1
            sizes[name] += sys.getsizeof(obj)
        with open(census, "w") as fh:
            json.dump({k: [counts[k], sizes[k]] for k in counts}, fh)
    if trace:
        import gc

        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        snap.dump(trace)
    if profiler is not None and pyinstrument:
        profiler.stop()
        with open(profile, "w") as fh:
            fh.write(
                profiler.output_html() if profile.endswith(".html") else profiler.output_text(color=False)
            )
    elif profiler is not None:
        import pstats

        profiler.disable()
        with open(profile, "w") as fh:
            pstats.Stats(profiler, stream=fh).sort_stats("cumulative").print_stats(60)
    from _common import emit

    emit(
        {
            "import_s": round(import_s, 3),
            "flow_wall_s": round(wall, 3),
            "flow_cpu_s": round(cpu, 3),
            "cpu_before_flow_s": round(cpu0, 3),
            "peak_rss_mb": round(_peak_mb(), 1),
            "peak_rss_prompt_phase_mb": round(_FINAL.get("peak_rss_prompt_phase_mb", 0.0), 1),
            **{
                k: _FINAL[k]
                for k in ("first_prompt_s", "peak_rss_first_prompt_mb", "rss_by_done_mb")
                if k in _FINAL
            },
            "state": state.type.value,
            "message": state.message,
            **gc_time.figures(),
            **_shared_limit_calls(),
        }
    )


if __name__ == "__main__":
    main()
