"""A slot of a Prefect global concurrency limit, held by a prompt task for as long as it runs (``--concurrency_limit``).

Every prompt of every flow run that names the same limit holds one slot of it while it runs, on
any worker or machine that talks to the same Prefect server: the server counts the slots. Each
slot is taken with a **lease** (Prefect's ``/v2/concurrency_limits/increment-with-lease``): the
server gives the slot back by itself when the lease runs out without a renewal, so the slots of a
run that crashed or was killed (SIGKILL) return within the lease time (plus the server's
repossessor pass, every 15 s by default) instead of staying taken for ever.

Prefect's own ``prefect.concurrency.sync.concurrency()`` does the same with the same endpoints, but
costs ~59 ms of client CPU per hold (measured on the project's 2-core machine: a renewal thread and a
new API client per hold, a renewal request at once, two events) against ~3 ms here, and its wait for a
slot cannot be interrupted by the run's stop. Here, in one process:

* one shared API client (``get_client(sync_client=True)``, opened once);
* a prompt asks for a slot at once; only when the limit is full (423) does it queue: the waiting
  prompts of a process take turns (one of them asks the server, after each ``Retry-After`` the
  server gives), so a full limit costs one request per ``Retry-After`` and process, not one per
  waiting prompt (Prefect's acquisition service serialises every request, which caps a process
  at one slot per round trip); a wait checks the run's stop every 0.25 s;
* one renewal thread renews, every ``lease / 4`` seconds, the leases held longer than
  ``lease / 2``: a prompt shorter than half the lease costs exactly two requests (take, give back).

Only Prefect's public client API is used (the REST endpoints of global concurrency limits v2).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from hermes_core import cancel

DEFAULT_LEASE_SECONDS = 120.0
"""Lease of a slot, seconds (``--concurrency_lease_seconds``; Prefect's server accepts 60 to 86,400)."""
_WAIT_SLICE = 0.25  # a wait for a slot re-checks the run's stop this often, seconds
_MAX_RETRY_AFTER = 30.0  # the server's own cap on its Retry-After (maximum_concurrency_slot_wait_seconds)

logger = logging.getLogger("hermes.shared_limit")

_client_lock = threading.Lock()
_client: Any = None
_turns: dict[str, threading.Lock] = {}  # limit name -> the lock of "whose turn it is to ask the server"
_leases: dict[UUID, list[float]] = {}  # held lease -> [last renewed (monotonic), lease seconds]
_leases_lock = threading.Lock()
_renewer: threading.Thread | None = None
_missing_warned: set[str] = set()
_calls: Counter[str] = (
    Counter()
)  # requests sent to the server, by kind (the benchmark's server calls per prompt)


def _api():
    """This process's Prefect API client (sync), opened on first use and kept open."""
    global _client
    with _client_lock:
        if _client is None:
            from prefect.client.orchestration import get_client

            client = get_client(sync_client=True)
            client.__enter__()
            _client = client
        return _client


@contextlib.contextmanager
def hold_slot(
    name: str | None, *, lease_seconds: float = DEFAULT_LEASE_SECONDS, holder: UUID | None = None
) -> Iterator[bool]:
    """Hold one slot of the global concurrency limit ``name`` for the block; no-op when ``name`` is None.

    Waits (as long as it takes) until the server grants a slot; the wait ends with the run's stop.

    Args:
        name: the limit's name, or None.
        lease_seconds: the lease, seconds (60 to 86,400): renewed while the block runs; a process
            killed while it holds the slot gives it back when the lease runs out.
        holder: the task run that holds the slot (shown by the server with the lease), or None.

    Yields:
        True when a slot is held; False when ``name`` is None or the limit does not exist (or is
        inactive): the block then runs without one, and a warning is logged once per name.

    Raises:
        PromptCancelled: the run was stopped while waiting for a slot.
        httpx.HTTPStatusError: the server refused the request (other than 423, "no slot free").
    """
    if name is None:
        yield False
        return
    lease_id = _acquire(name, lease_seconds, holder)
    if lease_id is None:
        yield False
        return
    _track(lease_id, lease_seconds)
    try:
        yield True
    finally:
        with _leases_lock:
            _leases.pop(lease_id, None)
        try:
            _calls["release"] += 1
            _api().release_concurrency_slots_with_lease(lease_id=lease_id)
        except Exception as exc:  # noqa: BLE001 - the lease runs out on the server anyway
            logger.warning("could not give back a slot of %s (it returns when its lease ends): %s", name, exc)


def _acquire(name: str, lease_seconds: float, holder: UUID | None) -> UUID | None:
    """The lease of one slot of ``name`` (waiting for one), or None when the limit does not exist."""
    holder_body = None
    if holder is not None:
        from prefect.client.schemas.objects import ConcurrencyLeaseHolder

        holder_body = ConcurrencyLeaseHolder(type="task_run", id=holder)
    with _client_lock:
        turn = _turns.setdefault(name, threading.Lock())
    lease_id = _ask(name, lease_seconds, holder_body)
    if lease_id is not _FULL:
        return lease_id
    while not turn.acquire(timeout=_WAIT_SLICE):  # another waiting prompt of this process is asking
        cancel.check_cancelled()
    try:
        while True:
            lease_id = _ask(name, lease_seconds, holder_body)
            if lease_id is not _FULL:
                return lease_id
    finally:
        turn.release()


_FULL = object()  # _ask's answer when the limit is full (it waited the server's Retry-After)


def _ask(name: str, lease_seconds: float, holder_body: Any) -> Any:
    """One request for a slot: its lease id; None when the limit does not exist; :data:`_FULL` (after
    waiting the server's ``Retry-After``) when no slot is free."""
    import httpx

    cancel.check_cancelled()
    try:
        _calls["acquire"] += 1
        reply = _api().increment_concurrency_slots_with_lease(
            names=[name],
            slots=1,
            mode="concurrency",
            lease_duration=lease_seconds,
            holder=holder_body,
        )
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 423:  # 423 Locked: no slot free now
            raise
        _calls["locked"] += 1
        wait = float(exc.response.headers.get("Retry-After", 1.0))
        cancel.sleep(min(max(wait, 0.05), _MAX_RETRY_AFTER))
        return _FULL
    body = reply.json()
    if not body.get("limits"):
        if name not in _missing_warned:
            _missing_warned.add(name)
            logger.warning(
                "global concurrency limit %s does not exist or is inactive: prompts run without a slot", name
            )
        return None
    return UUID(body["lease_id"])


def _track(lease_id: UUID, lease_seconds: float) -> None:
    """Renew ``lease_id`` from now on (until it is given back), starting the renewal thread once."""
    global _renewer
    with _leases_lock:
        _leases[lease_id] = [time.monotonic(), lease_seconds]
        if _renewer is None or not _renewer.is_alive():
            _renewer = threading.Thread(target=_renew_forever, name="hermes-lease-renewal", daemon=True)
            _renewer.start()


def _renew_forever() -> None:
    """Every quarter lease, renew the leases held longer than half their lease."""
    while True:
        with _leases_lock:
            shortest = min((lease for _, lease in _leases.values()), default=DEFAULT_LEASE_SECONDS)
        time.sleep(shortest / 4)
        now = time.monotonic()
        with _leases_lock:
            due = [(lease_id, lease) for lease_id, (at, lease) in _leases.items() if now - at >= lease / 2]
        for lease_id, lease in due:
            try:
                _calls["renew"] += 1
                _api().renew_concurrency_lease(lease_id=lease_id, lease_duration=lease)
            except Exception as exc:  # noqa: BLE001 - one failure must not stop the other renewals
                gone = getattr(getattr(exc, "response", None), "status_code", None) in (404, 410)
                if gone:  # expired or revoked on the server: nothing left to renew
                    with _leases_lock:
                        _leases.pop(lease_id, None)
                logger.warning(
                    "could not renew a concurrency lease (%s)%s",
                    exc,
                    ": its slot is free on the server, the limit may be passed until the prompt ends"
                    if gone
                    else "; trying again in a quarter lease",
                )
                continue
            with _leases_lock:
                if lease_id in _leases:
                    _leases[lease_id][0] = now


def server_calls() -> dict[str, int]:
    """Requests this process sent for slots so far: ``{"acquire", "locked", "renew", "release"}`` counts
    (``acquire`` counts every attempt, ``locked`` those answered 423: no slot free)."""
    return {kind: _calls[kind] for kind in ("acquire", "locked", "renew", "release")}


def held_leases() -> int:
    """Leases this process holds now (for tests and the live display)."""
    with _leases_lock:
        return len(_leases)


__all__ = ["DEFAULT_LEASE_SECONDS", "held_leases", "hold_slot", "server_calls"]
