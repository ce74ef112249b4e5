"""poll.wait_process (a process's end, waited on its pidfd) and programs.find_program (PATH, looked up once).

Real processes and a real PATH folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from hermes_core.environments.poll import wait_process
from hermes_core.environments.programs import find_program


def test_wait_process_returns_as_the_process_ends_and_times_out_while_it_runs():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            wait_process(sleeper, 0.3)
        assert 0.29 <= time.monotonic() - started < 5 and sleeper.returncode is None
        sleeper.send_signal(signal.SIGKILL)
        assert wait_process(sleeper, 10) == -signal.SIGKILL
        assert wait_process(sleeper, 0) == -signal.SIGKILL  # already known: at once
    finally:
        sleeper.kill()
        sleeper.wait()
    quick = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.2); sys.exit(7)"])
    assert wait_process(quick, None) == 7 and quick.returncode == 7


def test_find_program_is_which_and_follows_a_changed_path(tmp_path, monkeypatch):
    assert find_program("sh") == shutil.which("sh") and find_program("no-such-program-here") is None
    tool = tmp_path / "hermes-test-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert find_program("hermes-test-tool") is None
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert find_program("hermes-test-tool") == str(tool)
