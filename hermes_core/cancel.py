"""Stopping every prompt of this process at once (Ctrl-C, SIGTERM, a cancelled flow run).

:func:`cancel_running` sets a process-wide flag, wakes every prompt thread that waits on
a model request or a retry delay, and tears down every live environment, which kills the
commands running in it (local process groups, bubblewrap sandboxes, containers). Agents see
the flag before their next step and end with :class:`~hermes_core.exceptions.PromptCancelled`;
new prompts refuse to start. Deciding *when* to cancel (signals, the flow run's state) is the
flow's business, not this module's.

A model request cannot be interrupted from another thread (closing a client does not wake a
thread blocked on its socket), so :func:`call_interruptibly` runs it in a daemon thread and
returns, or raises PromptCancelled, as soon as the run is cancelled: a stopping process never
waits for a slow model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from hermes_core.environments import Environment
from hermes_core.exceptions import PromptCancelled

T = TypeVar("T")

_cancelled = threading.Event()
_no_new = threading.Event()
_live: set[Environment] = set()
_waiters: set[threading.Event] = set()
_in_flight = 0  # prompts between their task's start and end (see prompt_in_flight)
_lock = threading.Lock()


def cancel_running() -> int:
    """Cancel every prompt of this process; returns how many environments were torn down.

    Safe to call from any thread and more than once; environments are closed in this thread.
    """
    _cancelled.set()
    with _lock:
        envs = list(_live)
        waiters = list(_waiters)
    for event in waiters:
        event.set()
    for env in envs:
        try:
            env.close(interrupted=True)
        except Exception:  # noqa: BLE001 - teardown of the others must go on
            pass
    return len(envs)


def hold_new_prompts(hold: bool = True) -> None:
    """Refuse (``hold=True``) or allow again new attempts nobody admitted, without touching running ones.

    A retry of a prompt (Prefect starts it on its own, after a delay) then ends at once with
    PromptCancelled, before its sandbox exists: a run that drains (its budget is spent) starts no
    new attempt. First attempts are admitted by the flow when it submits them (see
    :func:`check_may_start`). The flow allows retries again when it starts.
    """
    if hold:
        _no_new.set()
    else:
        _no_new.clear()


def reset(wait: float = 5.0) -> bool:
    """Forget an earlier stop of this process: a new run starts with nothing cancelled or held.

    :func:`cancel_running` and :func:`hold_new_prompts` last for the life of the process, which is
    what a command line wants (it ends with its run). A process that runs another flow run after
    a stopped one (a Python session calling the flow twice, a test session) must not see that run
    cancelled from its first prompt: the flow calls this when it starts, before any prompt runs.

    Prompts still running in this process (:func:`prompt_in_flight`: a stopped run's prompts that
    are ending, or those of another flow run draining its spend cap) are given ``wait`` seconds
    to end. While one still runs, nothing is cleared: un-cancelling would let a stopped run's
    prompt go on, and un-holding would let a draining run start retries.

    Args:
        wait: seconds to wait for running prompts of this process to end, when a stop is set.

    Returns:
        True when nothing is cancelled or held any more; False when prompts of this process were
        still running after ``wait`` (nothing was cleared: :func:`is_cancelled` tells which stop stays).
    """
    deadline = time.monotonic() + wait
    while True:
        with _lock:
            if not (_cancelled.is_set() or _no_new.is_set()):
                return True
            if not (_live or _waiters or _in_flight):
                _cancelled.clear()
                _no_new.clear()
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


@contextmanager
def prompt_in_flight() -> Iterator[None]:
    """Count a prompt as running in this process while the block runs, for :func:`reset`.

    The prompt task enters it first, so a prompt waiting for a shared slot, or not yet in its
    environment, counts too.
    """
    global _in_flight
    with _lock:
        _in_flight += 1
    try:
        yield
    finally:
        with _lock:
            _in_flight -= 1


def check_may_start(*, retry: bool = False) -> None:
    """Raise PromptCancelled when the run is cancelled, or when ``retry`` and new attempts are held.

    A first attempt was admitted when the flow submitted it: the spend cap decides then, and under a
    cap no prompt waits in a queue. A hold that came after (another prompt's spend reached the cap)
    therefore does not stop it; it would only cut the run short of what the cap allowed. A retry
    is a start nobody admitted: held (:func:`hold_new_prompts`).
    """
    check_cancelled()
    if retry and _no_new.is_set():
        raise PromptCancelled("the run starts no new prompt (budget reached)")


def is_cancelled() -> bool:
    """True once :func:`cancel_running` was called in this process."""
    return _cancelled.is_set()


def check_cancelled() -> None:
    """Raise PromptCancelled when the process is being stopped."""
    if _cancelled.is_set():
        raise PromptCancelled("the run was cancelled")


@contextmanager
def tracked(env: Environment) -> Iterator[Environment]:
    """Register ``env`` as live while the block runs, so that :func:`cancel_running` can tear it down.

    Enter it BEFORE the environment starts (``with tracked(env), env:``): a cancel that comes
    while a container is being created then still removes it.
    """
    check_cancelled()
    with _lock:
        _live.add(env)
    try:
        yield env
    finally:
        with _lock:
            _live.discard(env)


@contextmanager
def _waiter() -> Iterator[threading.Event]:
    event = threading.Event()
    with _lock:
        _waiters.add(event)
    try:
        if _cancelled.is_set():
            event.set()
        yield event
    finally:
        with _lock:
            _waiters.discard(event)


def sleep(seconds: float) -> None:
    """Sleep ``seconds``, or raise PromptCancelled as soon as the run is cancelled."""
    with _waiter() as event:
        event.wait(max(seconds, 0.0))
    check_cancelled()


def call_interruptibly(fn: Callable[[], T]) -> T:
    """``fn()`` run in a daemon thread; its result or exception, or PromptCancelled at once on a cancel.

    The thread of a cancelled call is left to finish on its own (it holds no sandbox: the
    caller's environment is torn down by the cancel) and never keeps the process alive.
    """
    check_cancelled()
    outcome: list = []

    with _waiter() as event:

        def target() -> None:
            try:
                outcome.append((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome.append((False, exc))
            finally:
                event.set()

        threading.Thread(target=target, name="hermes-model-request", daemon=True).start()
        event.wait()
    if not outcome:
        raise PromptCancelled("the run was cancelled during a model request")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


__all__ = [
    "call_interruptibly",
    "cancel_running",
    "check_cancelled",
    "check_may_start",
    "hold_new_prompts",
    "is_cancelled",
    "prompt_in_flight",
    "reset",
    "sleep",
    "tracked",
]
