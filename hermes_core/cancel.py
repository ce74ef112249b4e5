"""Stopping every prompt of this process at once (Ctrl-C, a cancelled flow run).

:func:`cancel_running` sets a process-wide flag and tears down every live
environment, which kills the commands running in it (local process groups,
containers). Agents see the flag before their next model call and end with
:class:`~hermes_core.exceptions.PromptCancelled`; new prompts refuse to start.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from hermes_core.environments import Environment
from hermes_core.exceptions import PromptCancelled

_cancelled = threading.Event()
_live: set[Environment] = set()
_lock = threading.Lock()


def cancel_running() -> int:
    """Cancel every prompt of this process; returns how many environments were torn down."""
    _cancelled.set()
    with _lock:
        envs = list(_live)
    for env in envs:
        try:
            env.close(interrupted=True)
        except Exception:  # noqa: BLE001 - teardown of the others must go on
            pass
    return len(envs)


def reset() -> None:
    """Allow prompts to run again (after a cancellation, in a process that goes on)."""
    _cancelled.clear()


def check_cancelled() -> None:
    """Raise PromptCancelled when the process is being stopped."""
    if _cancelled.is_set():
        raise PromptCancelled("the run was cancelled")


@contextmanager
def tracked(env: Environment) -> Iterator[Environment]:
    """Register ``env`` as live while the block runs, so that :func:`cancel_running` can tear it down."""
    check_cancelled()
    with _lock:
        _live.add(env)
    try:
        yield env
    finally:
        with _lock:
            _live.discard(env)
