"""A dataset record's ``cwd`` for the local backend: never a host folder mounted writable.

The rule (docs/sandboxes.md):

* a **relative** ``cwd`` (``repo/src``, ``~/repo``) is a folder inside the prompt's own fresh
  folder, created empty; ``..`` may not leave it;
* an **absolute** ``cwd`` names an existing host folder that is **copied** into the prompt's
  folder (``<prompt folder>/<its name>``) and the commands start in the copy: the original is
  never written, and it is never visible to the sandbox. It must lie under one of the allowed
  roots (``HERMES_CWD_ROOTS``; by default the dataset file's own folder), hold at most
  ``HERMES_CWD_COPY_MAX_MB`` of files, and it is refused when it is, contains or lies inside
  ``/``, ``/proc``, ``/sys``, ``/dev``, ``/run``, a home folder (``/root``, ``/home``,
  ``/home/<user>``, this user's ``$HOME``), the run folder or the output folder (given by the
  caller). Symbolic links are copied as links (inside the sandbox they resolve in its own
  view); devices, FIFOs and sockets are left out.

A run checks every record's ``cwd`` with :func:`cwd_problem` before anything is spent and names
the line of each refused one; the sandbox applies :func:`prepare_workdir` when the prompt starts.

Examples:
    >>> cwd_problem("repo/src")
    >>> cwd_problem("../up")
    "'../up' leaves the prompt's folder (a relative cwd is a folder inside it)"
    >>> cwd_problem("/proc", roots=["/"])
    "'/proc' is refused: it is or holds a system folder (/proc)"
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
from collections.abc import Iterable

SYSTEM_FOLDERS = ("/proc", "/sys", "/dev", "/run", "/var/run")
"""Host folders a ``cwd`` may never be, hold or lie inside."""


def home_folders() -> list[str]:
    """``/root``, ``/home``, every ``/home/<user>`` and this user's ``$HOME`` (real paths)."""
    homes = {"/root", "/home", os.path.expanduser("~")}
    try:
        homes |= {os.path.join("/home", name) for name in os.listdir("/home")}
    except OSError:
        pass
    return sorted({os.path.realpath(home) for home in homes if home and home != "/"})


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def relative_workdir(cwd: str) -> str | None:
    """The normalised relative form of a relative (or ``~/``) ``cwd``; None when it is absolute."""
    if cwd == "~" or cwd.startswith("~/"):
        cwd = cwd[2:] or "."
    if os.path.isabs(cwd):
        return None
    return posixpath.normpath(cwd)


def cwd_problem(
    cwd: str,
    *,
    roots: Iterable[str] = (),
    refused: Iterable[str] = (),
    max_copy_bytes: int | None = None,
) -> str | None:
    """Why the local backend cannot use ``cwd``, or None when it can.

    Args:
        cwd: the record's ``cwd``.
        roots: folders an absolute ``cwd`` must lie under (empty: no absolute cwd is allowed).
        refused: more folders it may not be, hold or lie inside (the run folder, the output folder).
        max_copy_bytes: the most bytes of files an absolute ``cwd`` may hold (None: no limit);
            counting stops at the limit.

    Returns:
        None, or a one-line reason naming the rule.
    """
    if "\0" in cwd:
        return "cwd holds a NUL byte"
    relative = relative_workdir(cwd)
    if relative is not None:
        if relative == ".." or relative.startswith("../"):
            return f"{cwd!r} leaves the prompt's folder (a relative cwd is a folder inside it)"
        return None
    real = os.path.realpath(cwd)
    if real == "/":
        return f"{cwd!r} is refused: it is the root folder"
    for label, folders in (
        ("a system folder", SYSTEM_FOLDERS),
        ("a home folder", home_folders()),
        ("the run or output folder", [os.path.realpath(folder) for folder in refused]),
    ):
        for folder in folders:
            if _within(real, folder) or _within(folder, real):
                return f"{cwd!r} is refused: it is or holds {label} ({folder})"
    root_list = [os.path.realpath(root) for root in roots]
    if not any(_within(real, root) for root in root_list):
        where = ", ".join(root_list) or "none"
        return (
            f"{cwd!r} is outside the folders an absolute cwd may be copied from ({where}); "
            "add its parent to HERMES_CWD_ROOTS, or use a relative cwd"
        )
    if not os.path.isdir(real):
        return f"{cwd!r} is not an existing folder (an absolute cwd is copied into the prompt's folder)"
    if max_copy_bytes is not None and _size_over(real, max_copy_bytes):
        return f"{cwd!r} holds more than {max_copy_bytes // (1 << 20)} MB of files (HERMES_CWD_COPY_MAX_MB)"
    return None


def _size_over(folder: str, limit: int) -> bool:
    """True when the regular files under ``folder`` (links not followed) add up to more than ``limit`` bytes."""
    total = 0
    for top, _dirs, files in os.walk(folder):
        for name in files:
            try:
                info = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
                if total > limit:
                    return True
    return False


def prepare_workdir(folder: str, cwd: str | None) -> str:
    """Make the working directory of a prompt inside its fresh ``folder`` and return its absolute path.

    Args:
        folder: the prompt's own folder (absolute, existing).
        cwd: the record's ``cwd`` (already accepted by :func:`cwd_problem`), or None.

    Returns:
        ``folder`` (no cwd), ``folder/<relative cwd>`` (created), or ``folder/<name of the
        absolute cwd>`` holding a copy of it.

    Raises:
        OSError: the folder cannot be made or the copy fails.
        ValueError: ``cwd`` leaves the prompt's folder.
    """
    if not cwd:
        return folder
    relative = relative_workdir(cwd)
    if relative is not None:
        if relative == ".." or relative.startswith("../"):
            raise ValueError(f"cwd {cwd!r} leaves the prompt's folder")
        target = os.path.join(folder, relative)
        os.makedirs(target, exist_ok=True)
        return target
    source = os.path.realpath(cwd)
    target = os.path.join(folder, os.path.basename(source) or "cwd")
    shutil.copytree(source, target, symlinks=True, copy_function=_copy_regular, dirs_exist_ok=True)
    return target


def _copy_regular(source: str, target: str) -> None:
    """Copy a regular file (data and mode); leave out devices, FIFOs and sockets (opening a FIFO would block)."""
    if stat.S_ISREG(os.lstat(source).st_mode):
        shutil.copy2(source, target)


__all__ = ["SYSTEM_FOLDERS", "cwd_problem", "home_folders", "prepare_workdir", "relative_workdir"]
