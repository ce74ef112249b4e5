"""The scratch folder: a SIGKILLed process's sandbox folders are removed by the next process, a live one's never.

Real processes with real local sandboxes (plain and bubblewrap), each with ``TMPDIR`` set to the
test's own folder, so that no other test's folders are in sight.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from hermes_core.environments.scratch import LOCK_NAME, PREFIX, sweep_abandoned

HOLDER = textwrap.dedent(
    """
    import sys
    from hermes_core.environments.local import LocalEnvironment
    from hermes_core.settings import HermesSettings
    env = LocalEnvironment(settings=HermesSettings(local_isolation=sys.argv[1]))
    env.start()
    assert env.execute("echo written by the model > notes.txt").returncode == 0
    print(env.home, flush=True)
    if sys.argv[2] == "close":
        env.close()
    else:
        sys.stdin.read()  # until the test closes stdin or kills this process
    """
)


@pytest.fixture(params=["none", "bwrap"])
def mode(request) -> str:
    if request.param == "bwrap" and not shutil.which("bwrap") and os.environ.get("CI", "").lower() != "true":
        pytest.skip("bubblewrap (bwrap) is not installed")
    return request.param


def holder(tmp_path, mode: str, then: str) -> tuple[subprocess.Popen, str]:
    """A process holding a started sandbox (home with notes.txt) in ``tmp_path``: (process, its home)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, mode, then],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    home = proc.stdout.readline().strip()
    assert home.startswith(str(tmp_path.resolve())), home
    assert then == "close" or os.path.isfile(os.path.join(home, "notes.txt")), home
    return proc, home


def scratch_folders(tmp_path) -> list[str]:
    return sorted(name for name in os.listdir(tmp_path) if name.startswith(PREFIX))


def test_a_killed_processs_sandbox_folders_go_with_the_next_process_and_a_live_ones_stay(tmp_path, mode):
    killed, killed_home = holder(tmp_path, mode, "wait")
    alive, alive_home = holder(tmp_path, mode, "wait")
    killed_scratch = os.path.dirname(killed_home)
    assert os.path.dirname(killed_scratch) == str(tmp_path.resolve())  # <TMPDIR>/hermes-run-*/hermes-*
    assert os.path.basename(killed_scratch).startswith(PREFIX) and os.path.basename(killed_home).startswith(
        "hermes-"
    )
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert os.path.isfile(os.path.join(killed_home, "notes.txt"))  # SIGKILL: no cleanup ran

    closing, next_home = holder(tmp_path, mode, "close")  # the next process's first sandbox sweeps
    assert closing.wait(timeout=30) == 0
    assert not os.path.exists(killed_scratch)
    assert os.path.isfile(os.path.join(alive_home, "notes.txt"))  # alive: untouched
    assert scratch_folders(tmp_path) == [
        os.path.basename(os.path.dirname(alive_home))
    ]  # and the closed one's gone
    assert not os.path.exists(next_home)

    alive.stdin.close()  # a normal exit removes its own scratch folder
    assert alive.wait(timeout=30) == 0
    assert scratch_folders(tmp_path) == []


def test_the_sweep_skips_what_is_not_an_abandoned_scratch_folder_of_this_user(tmp_path):
    unlocked = tmp_path / f"{PREFIX}nolock"
    unlocked.mkdir()  # no lock file: not known to be ours, left alone
    (tmp_path / f"{PREFIX}file").write_text("not a folder")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / LOCK_NAME).write_text("")
    (tmp_path / f"{PREFIX}link").symlink_to(target)  # a symlink is never followed
    foreign = tmp_path / f"{PREFIX}foreign"
    foreign.mkdir()
    (foreign / LOCK_NAME).write_text("")
    if os.getuid() == 0:
        os.chown(foreign, 12345, 12345)
    abandoned = tmp_path / f"{PREFIX}abandoned"
    (abandoned / "hermes-x").mkdir(parents=True)
    (abandoned / LOCK_NAME).write_text("")

    removed = sweep_abandoned(str(tmp_path))

    assert removed == [str(abandoned)] and not abandoned.exists()
    assert unlocked.is_dir() and target.is_dir() and (tmp_path / f"{PREFIX}link").is_symlink()
    assert (tmp_path / f"{PREFIX}file").is_file()
    if os.getuid() == 0:
        assert foreign.is_dir()  # another user's


def test_a_folder_made_here_is_in_this_processs_locked_scratch_folder(tmp_path):
    import fcntl

    code = textwrap.dedent(
        """
        import os, sys
        from hermes_core.environments.scratch import make_temp_dir
        print(make_temp_dir("hermes-"), flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    folder = proc.stdout.readline().strip()
    scratch = os.path.dirname(folder)
    assert (
        oct(os.stat(folder).st_mode & 0o777) == "0o700" and oct(os.stat(scratch).st_mode & 0o777) == "0o700"
    )
    with open(os.path.join(scratch, LOCK_NAME)) as lock:
        with pytest.raises(BlockingIOError):  # held by the live process
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert sweep_abandoned(str(tmp_path)) == [] and os.path.isdir(folder)
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert not os.path.exists(scratch)
