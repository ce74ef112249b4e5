"""Waiting without ``select.select`` (limited to descriptors below 1,024), and for a process without polling."""

from __future__ import annotations

import os
import select
import subprocess
from typing import Any


def readable(fd: Any, timeout: float | None) -> bool:
    """True when ``fd`` (a descriptor or an object with ``fileno()``) is readable within ``timeout`` seconds.

    ``select.select`` raises ``ValueError: filedescriptor out of range`` for descriptors >= 1,024,
    which a flow process reaches with a few hundred prompts in flight (each has a sandbox's pipes
    and sockets and a model connection): at W = 1,024, 2,708 of 4,096 prompts failed that way
    (bench/ANALYSIS.md). ``poll`` has no such limit. ``timeout`` None waits without limit.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(None if timeout is None else max(timeout, 0.0) * 1000))


def wait_process(proc: subprocess.Popen, timeout: float | None) -> int:
    """``proc.wait(timeout)`` that sleeps on the process's pidfd instead of polling it.

    ``Popen.wait`` with a timeout polls ``waitpid`` with sleeps from 0.5 ms doubling to 50 ms: a
    process that ends after 5 ms is seen after 7.5 ms, one that ends after 17 ms after 31.5 ms, and
    each poll needs the GIL. With a pidfd (Linux 5.3) the wait wakes once, when the process ends.

    Returns:
        Its exit status (negative: the signal that killed it), as ``Popen.wait``.

    Raises:
        subprocess.TimeoutExpired: it still runs after ``timeout`` seconds (None: no limit).
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here, or already reaped: Popen's own wait
        return proc.wait(timeout=timeout)
    try:
        if proc.returncode is None and not readable(pidfd, timeout):
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(pidfd)
    return proc.wait()


__all__ = ["readable", "wait_process"]
