"""The scratch folder: a SIGKILLed process's sandbox folders are removed by the next process, a live one's never.

Real processes with real local sandboxes (plain and bubblewrap), each with ``TMPDIR`` set to the
test's own folder, so that no other test's folders are in sight.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from hermes_core.environments.scratch import LOCK_NAME, PREFIX, boot_id, sweep_abandoned

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


def lock_file(folder, text: str | None = None) -> None:
    """A ``.lock`` as a scratch folder's own: a regular file holding this kernel's boot id (or ``text``)."""
    (folder / LOCK_NAME).write_text(boot_id() if text is None else text)


def test_the_sweep_skips_what_is_not_an_abandoned_scratch_folder_of_this_user(tmp_path):
    unlocked = tmp_path / f"{PREFIX}nolock"
    unlocked.mkdir()  # no lock file: not known to be ours, left alone
    (tmp_path / f"{PREFIX}file").write_text("not a folder")
    target = tmp_path / "elsewhere"
    target.mkdir()
    lock_file(target)
    (tmp_path / f"{PREFIX}link").symlink_to(target)  # a symlink is never followed
    other_kernel = tmp_path / f"{PREFIX}otherhost"
    other_kernel.mkdir()  # another host's (a shared temp folder): its lock is not visible here
    lock_file(other_kernel, "00000000-0000-0000-0000-000000000000")
    lock_dir = tmp_path / f"{PREFIX}lockdir"
    (lock_dir / LOCK_NAME).mkdir(parents=True)  # .lock must be a regular file
    fifo = tmp_path / f"{PREFIX}fifo"
    fifo.mkdir()
    os.mkfifo(fifo / LOCK_NAME)  # opening it for reading would wait for a writer
    foreign = tmp_path / f"{PREFIX}foreign"
    if os.getuid() == 0:  # another user's folder can only be made by root
        foreign.mkdir()
        lock_file(foreign)
        os.chown(foreign, 12345, 12345)
    abandoned = tmp_path / f"{PREFIX}abandoned"
    (abandoned / "hermes-x").mkdir(parents=True)
    lock_file(abandoned)

    found: list[list[str]] = []
    sweep = threading.Thread(target=lambda: found.append(sweep_abandoned(str(tmp_path))), daemon=True)
    sweep.start()
    sweep.join(timeout=20)
    assert not sweep.is_alive(), "the sweep hangs (on the FIFO?)"

    assert found == [[str(abandoned)]] and not abandoned.exists()
    assert unlocked.is_dir() and target.is_dir() and (tmp_path / f"{PREFIX}link").is_symlink()
    assert (tmp_path / f"{PREFIX}file").is_file()
    assert (other_kernel / LOCK_NAME).is_file() and (lock_dir / LOCK_NAME).is_dir()
    assert stat.S_ISFIFO(os.lstat(fifo / LOCK_NAME).st_mode)
    assert foreign.is_dir() == (os.getuid() == 0)


def as_plain_user(argv: list[str]) -> list[str]:
    """``argv`` run without root's power over files: as root, with the file capabilities dropped (setpriv)."""
    if os.getuid() != 0:
        return argv
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", *argv]


SWEEP = textwrap.dedent(
    """
    import json, sys
    from hermes_core.environments.scratch import sweep_abandoned
    status = open("/proc/self/status").read()
    effective = int(status.split("CapEff:")[1].split()[0], 16)
    assert not effective & (1 << 1 | 1 << 3), "CAP_DAC_OVERRIDE or CAP_FOWNER still effective"
    print(json.dumps(sweep_abandoned(sys.argv[1])))
    """
)


def sweep_as_plain_user(root) -> list[str]:
    """What ``sweep_abandoned(root)`` removes when run by a user who cannot write a read-only folder."""
    proc = subprocess.run(
        as_plain_user([sys.executable, "-c", SWEEP, str(root)]), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


MESSY = textwrap.dedent(
    """
    import os, sys
    from hermes_core.environments.scratch import make_temp_dir
    home, outside = make_temp_dir("hermes-"), sys.argv[1]
    os.makedirs(f"{home}/ro/deeper")
    for folder in (f"{home}/ro", f"{home}/ro/deeper"):
        open(f"{folder}/f", "w").close()
    os.makedirs(f"{home}/closed/inner")
    open(f"{home}/closed/inner/f", "w").close()
    os.symlink(outside, f"{home}/ro/link")  # a link to a read-only folder outside
    os.chmod(f"{home}/ro/deeper", 0o500)
    os.chmod(f"{home}/ro", 0o500)
    os.chmod(f"{home}/closed/inner", 0o000)
    os.chmod(f"{home}/closed", 0o000)
    print(home, flush=True)
    sys.stdin.read()
    """
)


def test_folders_a_sandbox_made_read_only_go_with_the_sweep_and_a_symlink_out_is_not_followed(tmp_path):
    root, outside = tmp_path / "tmp", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "kept").write_text("host file")
    outside.chmod(0o500)
    proc = subprocess.Popen(
        [sys.executable, "-c", MESSY, str(outside)], env={**os.environ, "TMPDIR": str(root)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    home = proc.stdout.readline().strip()
    scratch = os.path.dirname(home)
    proc.kill()
    proc.wait()
    try:
        assert sweep_as_plain_user(root) == [scratch]
        assert not os.path.exists(scratch)
        assert (
            oct(outside.stat().st_mode & 0o777) == "0o500" and (outside / "kept").read_text() == "host file"
        )
    finally:
        outside.chmod(0o700)


@pytest.mark.skipif(os.getuid() != 0, reason="only root can put another user's folder in a scratch folder")
def test_a_folder_that_cannot_be_emptied_keeps_its_lock_for_the_next_sweep(tmp_path):
    scratch = tmp_path / f"{PREFIX}abandoned"
    stuck = scratch / "hermes-x" / "theirs"
    stuck.mkdir(parents=True)
    (stuck / "f").write_text("not ours to remove")
    lock_file(scratch)
    os.chown(stuck, 12345, 12345)  # the sweeping user can neither write it nor chmod it

    assert sweep_as_plain_user(tmp_path) == []  # reported only once it is gone
    assert (scratch / LOCK_NAME).is_file() and (stuck / "f").is_file()
    os.chown(stuck, 0, 0)
    assert sweep_as_plain_user(tmp_path) == [str(scratch)] and not scratch.exists()


FORKS = textwrap.dedent(
    """
    import os, sys
    from hermes_core.environments.scratch import scratch_dir
    print(scratch_dir(), flush=True)
    if os.fork() == 0:  # the child lives on after its parent is killed
        folder = scratch_dir()
        grandchild = os.fork()  # a fork in a forked child must not wait for the parent's lock
        if grandchild == 0:
            os._exit(0)
        os.waitpid(grandchild, 0)
        print(folder, flush=True)
        sys.stdin.read()
        sys.exit(0)  # a normal exit: removes its own folder
    sys.stdin.read()
    """
)


def test_a_forked_child_makes_its_own_folder_and_does_not_keep_its_killed_parents_alive(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", FORKS], env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    parents = proc.stdout.readline().strip()
    assert select.select([proc.stdout], [], [], 30)[0], (
        "the forked child did not answer (a deadlock at fork?)"
    )
    childs = proc.stdout.readline().strip()
    assert parents != childs and os.path.dirname(childs) == os.path.dirname(parents)
    proc.kill()
    proc.wait()
    try:
        # the child's copy of the lock was closed: the folder is free to sweep (by this sweep, or by
        # the child's own if it ran late)
        assert sweep_abandoned(str(tmp_path)) in ([parents], [])
        assert not os.path.exists(parents)
        assert os.path.isdir(childs)  # the child is alive
    finally:
        proc.stdin.close()  # the child reads end of file and exits
    deadline = time.monotonic() + 10
    while os.path.exists(childs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(childs)


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
