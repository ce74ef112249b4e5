"""The host programs the local sandboxes run (``bwrap``, ``slirp4netns``, ``bash``), looked up once.

``shutil.which`` stats the name in every folder of ``PATH`` (about 15 here, ~0.1 ms), and one
prompt's sandbox used to look up its programs six times: ~0.6 ms of the flow process's CPU per
prompt, under its GIL. The answer is kept per name and ``PATH`` value, so a changed ``PATH`` is
looked up again.
"""

from __future__ import annotations

import functools
import os
import shutil


def find_program(name: str) -> str | None:
    """The path of the program ``name`` on ``PATH`` (``shutil.which``), or None; cached per ``PATH``.

    A program installed while the process runs is found once ``PATH`` changes, or by a new process.
    """
    return _which(name, os.environ.get("PATH"))


@functools.lru_cache(maxsize=64)
def _which(name: str, path: str | None) -> str | None:
    return shutil.which(name, path=path)


__all__ = ["find_program"]
