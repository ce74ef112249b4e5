"""The run's spend cap, consulted before and after every model request of this process.

The flow decides whether a prompt may start (:class:`flows.budget.Budget`); a prompt that runs
makes many requests, each of which spends. So the flow also registers its budget here, under
the flow run's id, as a :class:`RequestGuard`: :class:`~hermes_core.client.ModelClient` calls
:meth:`~RequestGuard.before_request` before it sends a request (the guard may refuse it with
:class:`~hermes_core.exceptions.PromptCancelled`) and :meth:`~RequestGuard.after_request` with
the usage of each answer, so the cap sees spend as it happens, not when a prompt ends.

Guards live in the flow's process. Prompts that run in other processes (Dask workers) find no
guard here: their requests are not checked one by one, only their prompts' starts are.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hermes_core.usage import Usage


class RequestGuard(Protocol):
    """What a model client asks of a run's spend cap around each request."""

    def before_request(self) -> None:
        """Called before each request is sent.

        Raises:
            PromptCancelled: the request must not be sent (the cap is reached and the run cancels).
        """

    def after_request(self, usage: Usage) -> None:
        """Called with the usage (tokens, cost in USD) of each answered request."""


_guards: dict[str, RequestGuard] = {}
_lock = threading.Lock()


def register(key: str, guard: RequestGuard) -> None:
    """Make ``guard`` the guard of the run ``key`` (its flow run id) in this process."""
    with _lock:
        _guards[key] = guard


def unregister(key: str) -> None:
    """Forget the guard of the run ``key`` (no error when there is none)."""
    with _lock:
        _guards.pop(key, None)


def guard_of(key: str | None) -> RequestGuard | None:
    """The guard registered for the run ``key`` in this process, or None."""
    if key is None:
        return None
    with _lock:
        return _guards.get(key)


__all__ = ["RequestGuard", "guard_of", "register", "unregister"]
