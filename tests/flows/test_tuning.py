"""Process tuning of the flow (flows/tuning.py), observed in real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# 16 threads allocate at once, then glibc prints one "Arena N:" block per malloc arena to stderr.
_THREADS_THEN_ARENAS = """
import ctypes, sys, threading
from flows.tuning import limit_malloc_arenas
print(limit_malloc_arenas(int(sys.argv[1])) if sys.argv[1] != "0" else None)
barrier = threading.Barrier(16)
def work():
    barrier.wait()
    keep = [bytearray(4096) for _ in range(200)]
threads = [threading.Thread(target=work) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL(None).malloc_stats()
"""


def _arenas(cap: int, extra_env: dict[str, str] | None = None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}
    env |= extra_env or {}
    proc = subprocess.run(
        [sys.executable, "-c", _THREADS_THEN_ARENAS, str(cap)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return proc.stdout.strip(), sum(line.startswith("Arena ") for line in proc.stderr.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc arenas are Linux-only")
def test_malloc_arenas_are_capped_for_threads_started_after_the_call():
    result, arenas = _arenas(0)
    assert result == "None" and arenas >= 8  # glibc's default: one arena per thread, up to 8 per core
    assert _arenas(3) == ("True", 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc arenas are Linux-only")
def test_a_malloc_arena_max_set_by_the_user_wins():
    assert _arenas(3, {"MALLOC_ARENA_MAX": "5"}) == ("False", 5)
    assert _arenas(3, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=5"}) == ("False", 5)


def test_without_flow_heartbeats_turns_prefect_heartbeats_off_inside_only():
    from prefect.settings import get_current_settings

    from flows.tuning import without_flow_heartbeats

    before = get_current_settings().flows.heartbeat_frequency
    with without_flow_heartbeats():
        assert get_current_settings().flows.heartbeat_frequency is None  # the engine then starts no thread
    assert get_current_settings().flows.heartbeat_frequency == before


_GC_STATE = """
import gc, sys, weakref
from flows.tuning import tune_garbage_collector
if sys.argv[1] != "default":
    gc.set_threshold(*map(int, sys.argv[1].split(",")))
class Node: pass
node = Node()
node.me = node  # garbage that only the collector can free
freed = weakref.ref(node)
del node
print(tune_garbage_collector(), gc.get_threshold(), gc.get_freeze_count() > 0, freed() is None)
print(tune_garbage_collector(), gc.get_threshold())
"""


def _gc_state(thresholds: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _GC_STATE, thresholds],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.splitlines()


def test_the_collector_is_tuned_once_and_garbage_is_collected_before_the_freeze():
    from flows.tuning import GC_THRESHOLDS

    first, second = _gc_state("default")
    # tuned and objects frozen; the garbage cycle was collected first, not frozen for good
    assert first == f"True {GC_THRESHOLDS} True True"
    assert second == f"False {GC_THRESHOLDS}"  # a second call changes nothing


def test_thresholds_set_by_the_user_win():
    first, _ = _gc_state("2000,5,5")
    assert first == "False (2000, 5, 5) False False"  # nothing frozen, nothing collected
