"""Process and Prefect API settings that keep the cost per prompt low (measured in bench/ANALYSIS.md).

Each is a default only: a value the user has set wins.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
from collections.abc import Iterator

PREFECT_SERVER_SETTINGS: dict[str, str] = {
    # Prefect's default, 1, makes the task-run recorder write every task-run event with its own
    # SQL insert: ~27 ms of server CPU per prompt on 2 cores, ~9 ms with 500 (it still flushes
    # at least every 5 s, PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL).
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "500",
}
"""Settings of a Prefect API server that runs this flow: set for the local API the command line
starts, and recommended for ``prefect server start`` (README, deployments/OPERATIONS.md)."""

MALLOC_ARENA_MAX = 4
"""glibc malloc arenas for the flow process. Its default (8 per core) lets hundreds of prompt
threads fragment memory: peak RSS at 256 workers and 1,024 prompts 827 MB, against 499 MB with 4
at the same CPU (2 arenas cost ~3 ms CPU per prompt); bench/ANALYSIS.md."""

_M_ARENA_MAX = -8  # glibc malloc.h

GC_THRESHOLDS = (10_000, 4, 1)
"""The garbage collector's thresholds in the flow process (Python's default: 700, 10, 10): a young
collection every 10,000 allocations, a middle one every 5 young ones, a full one every 2 middle
ones. The full collections stay about as frequent as Python's (whose long-lived rule held them back
while the modules' objects counted): with ``(10_000, 10, 10)`` garbage that outlived a prompt piled
up between full collections, 351 MB of peak RSS at 4,000 prompts and 256 workers against 294."""

_PYTHON_GC_THRESHOLDS = (700, 10, 10)


def apply_prefect_server_defaults() -> None:
    """Put :data:`PREFECT_SERVER_SETTINGS` in this process's environment where unset (inherited by
    the local API server Prefect starts as a subprocess)."""
    for name, value in PREFECT_SERVER_SETTINGS.items():
        os.environ.setdefault(name, value)


def limit_malloc_arenas(arenas: int = MALLOC_ARENA_MAX) -> bool:
    """Cap glibc's malloc arenas for this process (``mallopt(M_ARENA_MAX)``, glibc ``malloc.h``).

    glibc fixes its arena limit once, the first time the process would create a 9th arena, so
    the cap only takes if it is set before that: call this early, before threads are started
    (the command line does it first thing; the flow again at its start, for flow runs started by
    a worker, where only Prefect's few threads exist yet). A ``MALLOC_ARENA_MAX`` or
    ``glibc.malloc.arena_max`` tunable set by the user wins. No-op off Linux/glibc.

    Returns:
        True when the cap was handed to glibc (it then applies unless the limit was already fixed).
    """
    if os.environ.get("MALLOC_ARENA_MAX") or "glibc.malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def tune_garbage_collector() -> bool:
    """Make the flow process's garbage collections cheaper: freeze what exists, collect young objects less often.

    A run allocates fast (trajectories, SDK and Prefect models on hundreds of threads) and Python
    started a young collection every 700 allocations; its full collections walked every object of
    Prefect, pydantic, openai and polars too: ~3 ms of CPU per prompt at 64 and 256 workers, each
    collection holding the GIL, about half of it saved (bench/ANALYSIS.md). This collects once,
    moves every surviving object to the permanent generation (``gc.freeze``: they are never walked
    again, and are still freed by reference counting) and sets :data:`GC_THRESHOLDS`. Call it
    once the modules are imported (the flow does at its start). Thresholds changed by the user (or
    by an earlier call in this process) win: nothing is done then.

    Returns:
        True when the collector was tuned by this call.
    """
    if gc.get_threshold() != _PYTHON_GC_THRESHOLDS or not gc.isenabled():
        return False
    gc.collect()  # garbage that exists now would otherwise be frozen with the rest, never reclaimed
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return True


@contextlib.contextmanager
def without_flow_heartbeats() -> Iterator[None]:
    """Flow runs started inside this block send no flow-run heartbeats (Prefect's setting set to None).

    Prefect's heartbeat thread sleeps in 1 s steps and the engine joins it when the flow ends,
    so every flow run pays up to 1 s (0.5 s on average) at its end, 2-3.5% of a 30 s run
    (bench/ANALYSIS.md). Heartbeats let a Prefect server detect a crashed flow run; the command
    line turns them off only for the local API it starts itself, which stops with the command
    (nothing is left to watch them). ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` cannot say None from
    the environment (it must be >= 30), hence this code-level setting
    (:func:`flows.prefect_adapter.flow_heartbeats_off`).
    """
    from flows.prefect_adapter import flow_heartbeats_off

    with flow_heartbeats_off():
        yield


DASK_WORKER_CONFIG: dict[str, object] = {
    # Dask's worker profiler samples every task thread with sys._current_frames() every 10 ms.
    # On Python 3.11 that call can deadlock the whole interpreter against the garbage collector
    # (CPython gh-106883, gh-116969; Dask turns its event-loop profiler off on 3.11 for this,
    # not the worker's): a worker with 128 prompt threads hung for good at W = 256. It also costs
    # ~10% of the wall time at W = 64, for a profile only the dashboard shows, and the local
    # cluster runs without one (bench/ANALYSIS.md).
    "distributed.worker.profile.enabled": False,
}
"""Dask settings of the workers of the local cluster the flow starts (``--task_runner=dask``
without ``--dask_address``); a cluster at ``--dask_address`` keeps its own settings."""


@contextlib.contextmanager
def local_dask_cluster_settings() -> Iterator[None]:
    """Dask settings in force while the local cluster is created: :data:`DASK_WORKER_CONFIG`.

    Dask's nannies copy the configuration of the flow process when they start the worker
    processes, so the cluster must be created inside this block. A setting given in the
    environment (``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED``, Dask's own convention) wins.
    """
    import dask

    updates = {
        key: value
        for key, value in DASK_WORKER_CONFIG.items()
        if "DASK_" + key.upper().replace(".", "__").replace("-", "_") not in os.environ
    }
    with dask.config.set(updates):
        yield
