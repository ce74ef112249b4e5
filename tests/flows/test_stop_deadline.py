"""A stop ends the process within its bound, whatever a prompt is doing (flows/stopping.py, README § Stopping a run).

Each case is a real process sent a real SIGTERM: a prompt thread that no cancel reaches, and a
thread that holds the GIL so that no Python code (not even the deadline's own thread) can run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUCK_RUN = """
import re, sys, threading, time
from flows.stopping import RunStop, StopDeadline

with StopDeadline(seconds=1.0, backstop=2.0), RunStop() as stop:
    print("ready", flush=True)
    while not stop.requested:
        time.sleep(0.01)
    if sys.argv[1] == "blocked":
        threading.Event().wait()  # a prompt where no cancel reaches: it never returns
    else:
        re.match(r"(a*)*b", "a" * 40)  # C code that holds the GIL for hours
print("the stuck work ended", flush=True)
"""


def stop_stuck_run(case: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run STUCK_RUN with ``case``, SIGTERM it once ready; (its outcome, seconds from the signal to its end)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_RUN, case],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, stdout, stderr
        ), time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_prompt_that_no_cancel_reaches_does_not_keep_the_process_past_its_deadline():
    done, seconds = stop_stuck_run("blocked")
    assert done.returncode == 130
    assert done.stdout == ""  # the stuck work never ended: the deadline ended the process
    assert done.stderr.strip().splitlines() == [
        "error: the run did not stop within 1 s of SIGTERM (a prompt did not end): exiting now; "
        "finished prompts are saved, run again with --resume to continue"
    ]
    assert seconds < 30  # 1 s bound; far below the 60 s the test would otherwise wait


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="the GIL and _sre are CPython's")
def test_a_thread_holding_the_gil_is_ended_by_the_faulthandler_backstop():
    done, seconds = stop_stuck_run("gil")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "Timeout (0:00:03)!" in done.stderr  # faulthandler at bound + backstop, 1 + 2 s
    assert 'File "<string>", line 12 in <module>' in done.stderr  # the stack of the GIL holder
    assert "did not stop within" not in done.stderr  # the deadline's own thread could not run
    assert seconds < 30
