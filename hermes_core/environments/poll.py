"""Waiting for a file descriptor without ``select.select`` (limited to descriptors below 1,024)."""

from __future__ import annotations

import select
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


__all__ = ["readable"]
