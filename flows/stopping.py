"""One way to stop a run, whatever asks for it (README § Stopping a run).

Ctrl-C (SIGINT), SIGTERM (to the command line, or from a worker's runner cancelling a
deployment's flow run), SIGHUP (the terminal was closed) and the flow run's ``CANCELLING`` state (the Prefect UI's Cancel,
``prefect flow-run cancel``) all turn on the same switch, :class:`RunStop`. Turning it on
calls :func:`hermes_core.cancel.cancel_running` in a thread of its own: no new prompt starts,
running prompts end with ``PromptCancelled`` within seconds (their commands killed, their
sandboxes removed, their model requests abandoned), and the flow, which watches the switch
while it waits for results, records what finished and ends Cancelled.

Prefect turns SIGTERM into ``TerminationSignal`` (``prefect.utilities.engine.capture_sigterm``),
which would end the flow run Crashed, and SIGINT into KeyboardInterrupt, raised wherever the
main thread is; SIGHUP's default ends the process at once. While a :class:`RunStop` is active its
own handlers replace all three, so a signal never interrupts a ledger write; the previous handlers
come back when it exits. Outside the flow (the local API starting, the summary),
:func:`interrupt_on_stop_signals` makes SIGTERM and SIGHUP raise KeyboardInterrupt as SIGINT does,
so the command line still ends as stopped (exit code 130) and stops what it started.

After a terminal is closed, every write to it fails (EIO): on SIGHUP the standard streams that
refer to a hung-up terminal are pointed at ``/dev/null`` (:func:`release_hung_up_terminal`), so
the run's last lines and its summary cannot turn the stop into a crash.

A stop has a bound, whatever a prompt is doing: a prompt thread blocked where no cancel reaches it
(a web request to a server that never answers, a host call that does not return) would keep the
flow in its task runner's shutdown, which waits for every thread. The command line arms a
:class:`StopDeadline`: :data:`STOP_DEADLINE_SECONDS` after a stop request it reports the flow run
Cancelled, says so on stderr and ends the process (exit code 130; the ledger holds every finished
prompt, ``--resume`` continues). A thread that holds the GIL, so that no Python code runs, is
covered by :mod:`faulthandler`'s C watchdog: :data:`GIL_BACKSTOP_SECONDS` later it prints every
thread's stack and ends the process with exit code 1.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import logging
import os
import signal
import sys
import termios
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any
from uuid import UUID

from hermes_core.cancel import cancel_running

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
"""How often the flow run's state is read from the Prefect API while prompts run."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run."""
STOP_DEADLINE_SECONDS = 30.0
"""Seconds from a stop request to the end of the command line, whatever its prompts do (:class:`StopDeadline`).

A stop normally ends it in 1-3 s; the flow gives running prompts 10 s to end
(``flows.dispatch.STOP_DRAIN_SECONDS``), the rest is for its last records and the local API's stop."""
GIL_BACKSTOP_SECONDS = 10.0
"""Seconds after :data:`STOP_DEADLINE_SECONDS` at which :mod:`faulthandler` ends a process whose GIL is held."""
REPORT_SECONDS = 3.0
"""How long an expiring :class:`StopDeadline` waits for the flow run's Cancelled state to be stored."""

_armed: StopDeadline | None = None


class StopDeadline:
    """For a process that is the run (the command line): once a stop is requested, it ends within ``seconds``.

    A context manager (arms it; at exit, disarms it and cancels a countdown). A stop request
    (:meth:`RunStop.request`, a stop signal under :func:`interrupt_on_stop_signals`) starts the
    countdown once. If the process still runs when it expires: one ``error:`` line on stderr, the
    flow run reported ``Cancelled`` (when its id is known, waiting at most :data:`REPORT_SECONDS`),
    then ``os._exit(exit_code)``: no ``finally`` block, no atexit handler runs (they may be what
    hangs). The ledger is safe there: each finished prompt is on disk as it arrives, a torn last
    line is repaired on the next open. ``faulthandler`` ends the process ``backstop`` seconds
    later (exit code 1, every thread's stack on stderr) if no Python code could run (GIL held).

    Args:
        seconds: the bound, seconds from the stop request.
        exit_code: the process's exit code when the bound is reached.
        backstop: seconds after the bound at which faulthandler ends the process.
    """

    def __init__(
        self,
        seconds: float = STOP_DEADLINE_SECONDS,
        *,
        exit_code: int = 130,
        backstop: float = GIL_BACKSTOP_SECONDS,
    ):
        self.seconds = seconds
        self.exit_code = exit_code
        self.backstop = backstop
        self.reason: str | None = None
        self.flow_run_id: UUID | str | None = None
        self._lock = threading.Lock()
        self._disarmed = threading.Event()

    def start(self, reason: str, flow_run_id: UUID | str | None = None) -> None:
        """Start the countdown (the first call only; a later one may add the flow run's id)."""
        with self._lock:
            self.flow_run_id = self.flow_run_id or flow_run_id
            if self.reason is not None or self._disarmed.is_set():
                return
            self.reason = reason
        faulthandler.dump_traceback_later(self.seconds + self.backstop, exit=True)
        threading.Thread(target=self._countdown, name="hermes-stop-deadline", daemon=True).start()

    def _countdown(self) -> None:
        if self._disarmed.wait(self.seconds):
            return
        print(
            f"error: the run did not stop within {self.seconds:g} s of {self.reason} (a prompt did not "
            "end): exiting now; finished prompts are saved, run again with --resume to continue",
            file=sys.stderr,
            flush=True,
        )
        if self.flow_run_id is not None:
            reporter = threading.Thread(target=self._report_cancelled, daemon=True)
            reporter.start()
            reporter.join(REPORT_SECONDS)
        os._exit(self.exit_code)

    def _report_cancelled(self) -> None:
        try:
            from prefect import get_client
            from prefect.states import Cancelled

            message = (
                f"stopped ({self.reason}): prompts still running after {self.seconds:g} s were abandoned"
            )
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(self.flow_run_id, Cancelled(message=message), force=True)
        except Exception as exc:  # noqa: BLE001 - the process ends anyway
            log.debug("could not report the flow run cancelled: %s", exc)

    def __enter__(self) -> StopDeadline:
        global _armed
        _armed = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _armed
        if _armed is self:
            _armed = None
        with self._lock:
            started = self.reason is not None
            self._disarmed.set()
        if started:
            faulthandler.cancel_dump_traceback_later()


def _stop_requested(reason: str, flow_run_id: UUID | str | None = None) -> None:
    """Start the armed :class:`StopDeadline`'s countdown, if one is armed."""
    deadline = _armed
    if deadline is not None:
        deadline.start(reason, flow_run_id)


def release_hung_up_terminal() -> list[int]:
    """Point the standard streams (fds 0-2) that refer to a hung-up terminal at ``/dev/null``.

    A terminal that still works (``kill -HUP`` from another shell), a file or a pipe is left alone.

    Returns:
        The file descriptors moved.
    """
    moved = []
    for fd in (0, 1, 2):
        try:
            termios.tcgetattr(fd)
            continue  # a working terminal
        except termios.error as exc:
            if not exc.args or exc.args[0] != errno.EIO:  # not a terminal (ENOTTY), closed (EBADF)
                continue
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        moved.append(fd)
    return moved


@contextlib.contextmanager
def interrupt_on_stop_signals() -> Iterator[None]:
    """While active (main thread only), SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt.

    For the command line around the flow: a stop signal while the local API starts or the summary
    prints ends it as stopped (exit code 130) after its ``finally`` blocks ran, instead of SIGTERM's
    and SIGHUP's default, an immediate exit. A :class:`RunStop` replaces these handlers while it
    is active. SIGHUP also calls :func:`release_hung_up_terminal`; each signal starts the armed
    :class:`StopDeadline`'s countdown.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            release_hung_up_terminal()
        _stop_requested(signal.Signals(signum).name)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, interrupt) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class RunStop:
    """The run's stop switch; a context manager that installs the signal handlers (main thread only).

    Args:
        flow_run_id: the flow run whose ``CANCELLING`` state stops the run (None: signals only).

    Attributes:
        reason: why the run stops (``"SIGINT"``, ``"SIGTERM"``, ``"SIGHUP"``, ``"the flow run was
            cancelled"``), or None.
    """

    def __init__(self, flow_run_id: UUID | str | None = None):
        self.flow_run_id = flow_run_id
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._previous: dict[int, Any] = {}
        self._last_poll = time.monotonic()

    @property
    def requested(self) -> bool:
        """True once something asked the run to stop."""
        return self.reason is not None

    def request(self, reason: str) -> None:
        """Turn the switch on (once): cancel every running prompt in a background thread."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        _stop_requested(reason, self.flow_run_id)
        threading.Thread(target=cancel_running, name="hermes-cancel", daemon=True).start()

    def poll(self) -> None:
        """Every :data:`POLL_SECONDS`, read the flow run's state; CANCELLING (or CANCELLED) stops the run.

        An unreachable API is ignored (the run goes on; the next poll tries again).
        """
        if self.flow_run_id is None or self.requested or time.monotonic() - self._last_poll < POLL_SECONDS:
            return
        self._last_poll = time.monotonic()
        try:
            from prefect import get_client

            with get_client(sync_client=True) as client:
                state = client.read_flow_run(self.flow_run_id).state
        except Exception as exc:  # noqa: BLE001 - a missed poll is not a reason to stop
            log.debug("could not read the flow run's state: %s", exc)
            return
        if state is not None and (state.is_cancelling() or state.is_cancelled()):
            self.request("the flow run was cancelled")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            release_hung_up_terminal()
        name = signal.Signals(signum).name
        if self.requested:
            log.warning("%s received: the run is already stopping", name)
            return
        self.request(name)

    def __enter__(self) -> RunStop:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


__all__ = [
    "GIL_BACKSTOP_SECONDS",
    "POLL_SECONDS",
    "STOP_DEADLINE_SECONDS",
    "STOP_SIGNALS",
    "RunStop",
    "StopDeadline",
    "interrupt_on_stop_signals",
    "release_hung_up_terminal",
]
