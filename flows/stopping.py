"""One way to stop a run, whatever asks for it (SPEC section 13).

Ctrl-C (SIGINT), SIGTERM (to the command line, or from a worker's runner cancelling a
deployment's flow run) and the flow run's ``CANCELLING`` state (the Prefect UI's Cancel,
``prefect flow-run cancel``) all turn on the same switch, :class:`RunStop`. Turning it on
calls :func:`hermes_core.cancel.cancel_running` in a thread of its own: no new prompt starts,
running prompts end with ``PromptCancelled`` within seconds (their commands killed, their
sandboxes removed, their model requests abandoned), and the flow, which watches the switch
while it waits for results, records what finished and ends Cancelled.

Prefect turns SIGTERM into ``TerminationSignal`` (``prefect.utilities.engine.capture_sigterm``),
which would end the flow run Crashed, and SIGINT into KeyboardInterrupt, raised wherever the
main thread is. While a :class:`RunStop` is active its own handlers replace both, so a signal
never interrupts a ledger write; the previous handlers come back when it exits.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any
from uuid import UUID

from hermes_core.cancel import cancel_running

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
"""How often the flow run's state is read from the Prefect API while prompts run."""


class RunStop:
    """The run's stop switch; a context manager that installs the signal handlers (main thread only).

    Args:
        flow_run_id: the flow run whose ``CANCELLING`` state stops the run (None: signals only).

    Attributes:
        reason: why the run stops (``"SIGINT"``, ``"SIGTERM"``, ``"the flow run was cancelled"``), or None.
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
        name = signal.Signals(signum).name
        if self.requested:
            log.warning("%s received: the run is already stopping", name)
            return
        self.request(name)

    def __enter__(self) -> RunStop:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


__all__ = ["POLL_SECONDS", "RunStop"]
