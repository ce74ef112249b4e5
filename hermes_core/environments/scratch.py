"""The process's scratch folder: every host-side temp folder of the sandboxes, and what a killed process left.

The local sandboxes keep host folders (a prompt's home, the ``/tmp`` of its bubblewrap sandbox,
the outbound sandboxes' ``resolv.conf``, the isolation probe's folders, Apptainer's env file).
Each is removed when its sandbox closes, and at the latest when the process exits. A process
killed with SIGKILL (or by the kernel's OOM killer) runs no cleanup: its folders used to stay in
``/tmp`` for good, one set per prompt in flight, holding what the model wrote.

So all of them are made inside one folder per process, ``$TMPDIR/hermes-run-XXXXXXXX/``, which
holds a lock file (``.lock``, holding the kernel's boot id) that the process keeps locked
(``flock``) for its whole life. The kernel releases the lock when the process dies, however it
dies. The first scratch folder that a process makes starts a sweep, in a background thread, that
removes every ``hermes-run-*`` folder of the same user whose lock it can take: the folders of
processes that are gone. Skipped: a live process's folder, another user's, symlinks, folders
without a regular ``.lock`` file, and folders of another kernel (another host sharing the temp
folder, whose locks this kernel cannot see).

Removal gives the owner back write access to the folders a sandbox made read-only (``chmod
500``), without following a symlink, and deletes ``.lock`` last: a folder that cannot be emptied
keeps its lock file, so the next sweep tries again. The lock file is made under another name,
locked, then renamed to ``.lock``: a sweeping process never finds an unlocked ``.lock`` in a
folder whose owner is alive. On a file system without ``flock`` the folder gets no ``.lock`` (a
warning says so): no other process removes it, this one does at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import threading

logger = logging.getLogger(__name__)

PREFIX = "hermes-run-"
"""Name prefix of the per-process scratch folders in the temp folder."""

LOCK_NAME = ".lock"
"""The lock file in each scratch folder, held (``flock`` exclusive) by its process while it lives."""

_SWEEP_JOIN_S = 5.0  # at exit, how long the sweep may still run before the process goes on exiting

_lock = threading.Lock()
_made: tuple[str, int] | None = None  # (folder, its locked fd, or -1 where flock is not supported)
_sweeper: threading.Thread | None = None
_at_exit = False


def boot_id() -> str:
    """This kernel's boot id (``/proc/sys/kernel/random/boot_id``), ``""`` where it cannot be read.

    The text of every ``.lock`` file: a sweep only removes folders whose lock file holds its own.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            return file.read().strip()
    except OSError:
        return ""


def scratch_dir() -> str:
    """This process's scratch folder (made and locked on first use, removed at exit).

    The first call also starts the sweep of abandoned scratch folders in a background thread.

    Returns:
        The folder's real path, ``<temp folder>/hermes-run-XXXXXXXX`` (mode 0700).

    Raises:
        OSError: the temp folder is not writable.
    """
    global _made, _sweeper, _at_exit
    with _lock:
        if _made is not None:
            if os.path.isdir(_made[0]):
                return _made[0]
            gone, _made = _made, None  # removed under us: a new one
            _close(gone[1])
        _made = _make_locked()
        if not _at_exit:
            atexit.register(_remove_own)
            _at_exit = True
        sweep = _sweeper is None
        if sweep:
            _sweeper = threading.Thread(target=sweep_abandoned, name="hermes-scratch-sweep", daemon=True)
        folder = _made[0]
    if sweep:
        try:
            _sweeper.start()
        except RuntimeError:  # no thread can be started now: the next process sweeps
            logger.debug("the sweep of abandoned scratch folders could not start", exc_info=True)
    return folder


def _make_locked() -> tuple[str, int]:
    folder = os.path.realpath(tempfile.mkdtemp(prefix=PREFIX))
    fd, pending = tempfile.mkstemp(prefix=".lock-", dir=folder)
    try:
        os.write(fd, boot_id().encode("ascii"))
        fcntl.flock(fd, fcntl.LOCK_EX)  # fds are not inherited by commands (O_CLOEXEC): the lock dies with us
    except OSError as exc:  # e.g. ENOLCK: a file system without flock
        os.close(fd)
        os.unlink(pending)
        logger.warning(
            "scratch folder %s cannot be locked (%s): it is removed when this process exits, "
            "but not by a later run if this process is killed",
            folder, exc,
        )  # fmt: skip
        return folder, -1
    try:
        os.rename(pending, os.path.join(folder, LOCK_NAME))
    except OSError:
        os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)  # just made, holds only the pending lock file
        raise
    return folder, fd


def make_temp_dir(prefix: str) -> str:
    """A new folder (mode 0700) in this process's scratch folder; the caller removes it when done.

    Args:
        prefix: the start of its name, e.g. ``"hermes-"``.

    Returns:
        Its real path.

    Raises:
        OSError: it cannot be made.
    """
    return os.path.abspath(tempfile.mkdtemp(prefix=prefix, dir=scratch_dir()))  # real: scratch_dir() is


def make_temp_file(prefix: str) -> tuple[int, str]:
    """A new private file (mode 0600) in this process's scratch folder: ``(open fd, path)``, as ``tempfile.mkstemp``.

    Raises:
        OSError: it cannot be made.
    """
    return tempfile.mkstemp(prefix=prefix, dir=scratch_dir())


def sweep_abandoned(root: str | None = None) -> list[str]:
    """Remove the scratch folders in ``root`` (default: the temp folder) whose process is gone.

    A folder is removed when it is a real directory owned by this user, named ``hermes-run-*``,
    holds a regular file ``.lock`` of this user with this kernel's :func:`boot_id`, and that lock
    can be taken at once (its process died, so the kernel released it). Errors on one folder skip
    it; a folder that cannot be emptied keeps its ``.lock`` for the next sweep.

    Returns:
        The paths removed (gone when this returns).
    """
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = [name for name in os.listdir(root) if name.startswith(PREFIX)]
    except OSError:
        return removed
    boot = boot_id()
    own = _made[0] if _made is not None else None
    for name in names:
        path = os.path.join(root, name)
        if own is not None and os.path.realpath(path) == own:
            continue  # never lock our own .lock twice (a file system emulating flock per process)
        fd = _take_abandoned_lock(path, boot)
        if fd is None:
            continue
        try:
            if _remove(path):
                removed.append(path)
        finally:
            os.close(fd)
    return removed


def _take_abandoned_lock(folder: str, boot: str) -> int | None:
    """The locked fd of ``folder``'s ``.lock`` when the folder is an abandoned scratch folder of ours, else None."""
    try:
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return None
        # O_NONBLOCK: a FIFO named .lock does not hang the sweep; fstat then refuses it
        fd = os.open(
            os.path.join(folder, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises when held: its process is alive
            if os.read(fd, 64).decode("ascii", "replace").strip() == boot:
                return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _remove(folder: str) -> bool:
    """Remove ``folder`` and everything in it, ``.lock`` last; True when it is gone."""
    try:
        _owner_rwx(folder)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        try:
            names = os.listdir(fd)
        except OSError:
            return False
        left = False
        for name in names:
            if name != LOCK_NAME:
                try:
                    _remove_entry(name, fd)
                except (OSError, RecursionError):  # RecursionError: a tree deeper than the recursion limit
                    left = True
        if left:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(LOCK_NAME, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        pass
    except OSError:  # filled again meanwhile: give it back a lock file, so a later sweep tries again
        with contextlib.suppress(OSError):
            _write_lock_file(folder)
        return False
    return True


def _write_lock_file(folder: str) -> None:
    """A new, unlocked ``.lock`` (this kernel's boot id) in ``folder``: a sweep may then remove the folder."""
    fd = os.open(
        os.path.join(folder, LOCK_NAME),
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        os.write(fd, boot_id().encode("ascii"))
    finally:
        os.close(fd)


def _remove_entry(name: str, dir_fd: int) -> None:
    """Remove the entry ``name`` of the folder ``dir_fd``: a file, a symlink (never followed) or a tree."""
    if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    try:
        shutil.rmtree(name, dir_fd=dir_fd)
        return
    except OSError:
        pass  # a folder the sandbox made read-only: give the owner rwx on every folder, then again
    _owner_rwx(name, dir_fd)
    for _, folders, _, fd in os.fwalk(name, dir_fd=dir_fd):  # never descends through a symlink
        for folder in folders:
            with contextlib.suppress(OSError):
                _owner_rwx(folder, fd)
    shutil.rmtree(name, dir_fd=dir_fd)


def _owner_rwx(name: str, dir_fd: int | None = None) -> None:
    """Give the owner rwx on the folder ``name``; a symlink is refused (OSError), never followed."""
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & stat.S_IRWXU != stat.S_IRWXU:
            os.chmod(f"/proc/self/fd/{fd}", mode | stat.S_IRWXU)  # an O_PATH fd: chmod through /proc
    finally:
        os.close(fd)


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def _remove_own() -> None:
    """At exit: let the sweep finish (bounded), then remove this process's own scratch folder."""
    global _made
    if _sweeper is not None and _sweeper.is_alive():
        _sweeper.join(_SWEEP_JOIN_S)
    made, _made = _made, None
    if made is not None:
        _remove(made[0])
        _close(made[1])


def _after_fork_in_child() -> None:
    """A forked child makes its own scratch folder, and drops its copy of the parent's lock.

    The fork happened with :data:`_lock` held (``before=_lock.acquire``): no thread was half-way
    through making the folder, so every lock file descriptor of the parent is in ``_made``.
    """
    global _lock, _made, _sweeper
    _lock = threading.Lock()
    if _made is not None:
        _close(_made[1])  # else the parent's folder would look alive while this child lives
    _made = None
    _sweeper = None


def _before_fork() -> None:
    _lock.acquire()  # the module's lock of now (a forked child has its own): looked up at each fork


def _after_fork_in_parent() -> None:
    _lock.release()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)

__all__ = [
    "LOCK_NAME",
    "PREFIX",
    "boot_id",
    "make_temp_dir",
    "make_temp_file",
    "scratch_dir",
    "sweep_abandoned",
]
