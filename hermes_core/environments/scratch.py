"""The process's scratch folder: every host-side temp folder of the sandboxes, and what a killed process left.

The local sandboxes keep host folders (a prompt's home, the ``/tmp`` of its bubblewrap sandbox,
the outbound sandboxes' ``resolv.conf``, the isolation probe's folders, Apptainer's env file).
Each is removed when its sandbox closes, and at the latest when the process exits. A process
killed with SIGKILL (or by the kernel's OOM killer) runs no cleanup: its folders used to stay in
``/tmp`` for good, one set per prompt in flight, holding what the model wrote.

So all of them are made inside one folder per process, ``$TMPDIR/hermes-run-XXXXXXXX/``, which
holds a lock file (``.lock``) that the process keeps locked (``flock``) for its whole life. The
kernel releases the lock when the process dies, however it dies. The first scratch folder that a
process makes removes every ``hermes-run-*`` folder of the same user whose lock it can take: the
folders of processes that are gone. A live process's folder is never touched, and folders of
other users, symlinks and folders without a lock file are skipped.

The lock file is made under another name, locked, then renamed to ``.lock``: a sweeping process
never finds an unlocked ``.lock`` in a folder whose owner is alive.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import threading

PREFIX = "hermes-run-"
"""Name prefix of the per-process scratch folders in the temp folder."""

LOCK_NAME = ".lock"
"""The lock file in each scratch folder, held (``flock`` exclusive) by its process while it lives."""

_lock = threading.Lock()
_scratch: dict[int, tuple[str, int]] = {}  # pid -> (folder, locked fd): a forked child makes its own


def scratch_dir() -> str:
    """This process's scratch folder (made, locked and swept for on first use; removed at exit).

    Returns:
        The folder's real path, ``<temp folder>/hermes-run-XXXXXXXX`` (mode 0700).

    Raises:
        OSError: the temp folder is not writable.
    """
    pid = os.getpid()
    with _lock:
        made = _scratch.get(pid)
        if made is not None:
            if os.path.isdir(made[0]):
                return made[0]
            os.close(made[1])  # removed under us: a new one
        sweep_abandoned()
        folder = os.path.realpath(tempfile.mkdtemp(prefix=PREFIX))
        fd, pending = tempfile.mkstemp(prefix=".lock-", dir=folder)
        fcntl.flock(fd, fcntl.LOCK_EX)  # fds are not inherited (O_CLOEXEC): the lock dies with us
        os.rename(pending, os.path.join(folder, LOCK_NAME))
        _scratch[pid] = (folder, fd)
        if made is None:
            atexit.register(_remove_own)
        return folder


def make_temp_dir(prefix: str) -> str:
    """A new folder (mode 0700) in this process's scratch folder; the caller removes it when done.

    Args:
        prefix: the start of its name, e.g. ``"hermes-"``.

    Returns:
        Its real path.

    Raises:
        OSError: it cannot be made.
    """
    return os.path.realpath(tempfile.mkdtemp(prefix=prefix, dir=scratch_dir()))


def make_temp_file(prefix: str) -> tuple[int, str]:
    """A new private file (mode 0600) in this process's scratch folder: ``(open fd, path)``, as ``tempfile.mkstemp``.

    Raises:
        OSError: it cannot be made.
    """
    return tempfile.mkstemp(prefix=prefix, dir=scratch_dir())


def sweep_abandoned(root: str | None = None) -> list[str]:
    """Remove the scratch folders in ``root`` (default: the temp folder) whose process is gone.

    A folder is removed when it is a real directory owned by this user, named ``hermes-run-*``,
    holds ``.lock``, and that lock can be taken at once (its process died, so the kernel released
    it). Errors on one folder skip it.

    Returns:
        The paths removed.
    """
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = [name for name in os.listdir(root) if name.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: its process is alive
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def _remove_own() -> None:
    """At exit: remove this process's scratch folder (what its sandboxes did not remove themselves)."""
    made = _scratch.pop(os.getpid(), None)
    if made is None:
        return
    folder, fd = made
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(fd)


__all__ = ["LOCK_NAME", "PREFIX", "make_temp_dir", "make_temp_file", "scratch_dir", "sweep_abandoned"]
