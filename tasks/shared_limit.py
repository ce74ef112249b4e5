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
* **handover**: a prompt that ends keeps its lease as a *spare* of this process for
  :data:`HANDOVER_GRACE_SECONDS` (0.5 s) instead of giving it back; a prompt that starts takes a
  spare first (no request) and asks the server only when none is spare. With a busy window a slot
  then costs two requests (take, give back) per :data:`HANDOVER_MAX_AGE_SECONDS` of its life instead
  of two per prompt: about ``2 * prompt seconds / 20`` requests per prompt (0.3 at 3 s per prompt).
  Bounds, so that a process never starves the other runs sharing the limit:

  - a lease is handed over only while its age (since the server granted it) is below
    :data:`HANDOVER_MAX_AGE_SECONDS` (20 s); an older one goes back to the server when its prompt
    ends, so each slot returns to the server at least once per max age plus one prompt, and a run
    waiting on a full limit gets its chance at least that often per slot;
  - a spare nobody takes within the grace goes back to the server (the renewal thread releases it),
    so slots a process stops needing return within ~0.5 s; at once when the run is stopped
    (``hermes_core.cancel``: a prompt then gives its lease back instead of sparing it);
  - :func:`release_spare_slots` gives every spare back at once (the flow calls it when its prompts
    are done; also at interpreter exit);
  - spares are renewed like held leases; the server keeps the holder of the prompt that took the
    lease first (a handed-over lease is not re-labelled: that would be one more request).

* a prompt that finds no spare asks for a slot at once; only when the limit is full (423) does it
  queue: the waiting prompts of a process take turns (one of them asks the server, after each
  ``Retry-After`` the server gives), so a full limit costs one request per ``Retry-After`` and
  process, not one per waiting prompt (Prefect's acquisition service serialises every request, which
  caps a process at one slot per round trip); a waiting prompt takes a spare of its own process as
  soon as one is left (no request), and checks the run's stop every 0.25 s;
* one background thread renews each lease (held or spare) half a lease after its last renewal
  (again after a quarter lease when a renewal fails) and releases the spares whose grace is over; it
  sleeps until the next of these due times (a ``threading.Condition``). A prompt shorter than half
  the lease costs no renewal.

Only Prefect's public client API is used (the REST endpoints of global concurrency limits v2).
Processes do not share spares: with Dask worker processes each process has its own pool (the
flow's :func:`release_spare_slots` reaches only its own; the workers' spares go back after the grace,
or at their exit).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from hermes_core import cancel

DEFAULT_LEASE_SECONDS = 120.0
"""Lease of a slot, seconds (``--concurrency_lease_seconds``; Prefect's server accepts 60 to 86,400)."""
HANDOVER_GRACE_SECONDS = 0.5
"""How long a lease whose prompt ended stays spare for the next prompt of this process, seconds
(0: never hand over). The next prompt of a busy window starts within milliseconds of the last one's end."""
HANDOVER_MAX_AGE_SECONDS = 20.0
"""A lease older than this (seconds since the server granted it) is given back when its prompt ends,
not handed over: the longest a process keeps a slot from other runs, plus one prompt and the grace."""
_WAIT_SLICE = 0.25  # a wait for a slot (and a pool of spares) re-checks the run's stop this often, seconds
_MAX_RETRY_AFTER = 30.0  # the server's own cap on its Retry-After (maximum_concurrency_slot_wait_seconds)

logger = logging.getLogger("hermes.shared_limit")


class _Lease:
    """One lease this process holds (for a prompt, or spare)."""

    __slots__ = ("id", "name", "seconds", "granted", "renew_at", "spare_until")

    def __init__(self, lease_id: UUID, name: str, seconds: float) -> None:
        self.id = lease_id
        self.name = name
        self.seconds = seconds  # the lease's duration, seconds
        self.granted = time.monotonic()  # when the server granted it (monotonic seconds)
        self.renew_at = self.granted + seconds / 2  # next renewal due (monotonic seconds)
        self.spare_until: float | None = None  # spare: released at this time unless taken (monotonic)


class _Wait:
    """The prompts of this process waiting for a slot of one limit: whose turn, and until when the server said wait."""

    __slots__ = ("asking", "retry_at")

    def __init__(self) -> None:
        self.asking = False  # one waiting prompt is asking the server now
        self.retry_at = 0.0  # the limit was full: nobody asks before this time (monotonic seconds)


_client_lock = threading.Lock()
_client: Any = None
_leases_lock = threading.Lock()  # guards everything below down to _wake_at
_leases: dict[UUID, _Lease] = {}  # every lease of this process, held or spare (the renewal thread's list)
_spares: dict[str, list[_Lease]] = {}  # limit name -> spare leases, the last spared last (taken first)
_waits: dict[str, _Wait] = {}
_spare_ready = threading.Condition(_leases_lock)  # a spare was left, or a waiting prompt's turn ended
_wake = threading.Condition(_leases_lock)  # wakes the renewal thread (an earlier due time)
_wake_at = math.inf  # when the renewal thread wakes next (-inf: it is working, will look again)
_renewer: threading.Thread | None = None
_missing_warned: set[str] = set()
_calls_lock = threading.Lock()
_calls: Counter[str] = Counter()  # requests sent to the server, by kind (the benchmark's server calls per
# prompt), and "handover": slots a prompt took from a spare instead of asking the server


def _count(kind: str) -> None:
    with _calls_lock:
        _calls[kind] += 1


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


def open_api_client() -> None:
    """Open this process's API client now, with the Prefect settings of the calling thread (its
    ``PREFECT_API_URL``), instead of at the first slot request, in whatever thread makes it. Idempotent."""
    _api()


def close_api_client() -> None:
    """Close this process's API client; the next slot request (or :func:`open_api_client`) opens a new
    one with the settings then current. Leases held are not given back: call
    :func:`release_spare_slots` first."""
    global _client
    with _client_lock:
        client, _client = _client, None
    if client is not None:
        client.__exit__(None, None, None)


@contextlib.contextmanager
def hold_slot(
    name: str | None, *, lease_seconds: float = DEFAULT_LEASE_SECONDS, holder: UUID | None = None
) -> Iterator[bool]:
    """Hold one slot of the global concurrency limit ``name`` for the block; no-op when ``name`` is None.

    Takes a spare lease of this process when there is one (no request); otherwise waits (as long as
    it takes) until the server grants a slot, or a prompt of this process leaves a spare; the wait
    ends with the run's stop. At the end of the block the lease becomes a spare for
    :data:`HANDOVER_GRACE_SECONDS` while younger than :data:`HANDOVER_MAX_AGE_SECONDS` (and the run
    is not stopped); otherwise it is given back at once.

    Args:
        name: the limit's name, or None.
        lease_seconds: the lease, seconds (60 to 86,400): renewed while the block runs (and while
            spare); a process killed while it holds the slot gives it back when the lease runs out.
            A handed-over lease keeps the duration it was taken with.
        holder: the task run that holds the slot (shown by the server with the lease; a handed-over
            lease keeps its first holder), or None.

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
    lease = _acquire(name, lease_seconds, holder)
    if lease is None:
        yield False
        return
    try:
        yield True
    finally:
        _give_back(lease)


def _give_back(lease: _Lease) -> None:
    """End a prompt's hold: spare ``lease`` for the next prompt, or release it (too old, stopped, no grace)."""
    now = time.monotonic()
    with _leases_lock:
        if lease.id not in _leases:  # dropped: the server said it expired or was revoked
            return
        if (
            HANDOVER_GRACE_SECONDS > 0
            and now - lease.granted < HANDOVER_MAX_AGE_SECONDS
            and not cancel.is_cancelled()
        ):
            lease.spare_until = now + HANDOVER_GRACE_SECONDS
            _spares.setdefault(lease.name, []).append(lease)
            _spare_ready.notify_all()
            _schedule(min(lease.spare_until, now + _WAIT_SLICE))  # (a spare: it looks at the stop too)
            return
        del _leases[lease.id]
    _release(lease)


def _release(lease: _Lease) -> None:
    """Give ``lease``'s slot back to the server (one request); a failure is logged, not raised."""
    try:
        _count("release")
        _api().release_concurrency_slots_with_lease(lease_id=lease.id)
    except Exception as exc:  # noqa: BLE001 - the lease runs out on the server anyway
        logger.warning(
            "could not give back a slot of %s (it returns when its lease ends): %s", lease.name, exc
        )


def _take_spare(name: str) -> _Lease | None:
    """A spare lease of ``name``, taken out of the pool (the last spared), or None. Call with the lock held."""
    pool = _spares.get(name)
    if not pool:
        return None
    lease = pool.pop()
    lease.spare_until = None
    _count("handover")
    return lease


def _acquire(name: str, lease_seconds: float, holder: UUID | None) -> _Lease | None:
    """A lease of one slot of ``name`` (a spare, or the server's, waiting for one), or None when the
    limit does not exist."""
    cancel.check_cancelled()
    with _leases_lock:
        lease = _take_spare(name)
        if lease is not None:
            return lease
        wait = _waits.setdefault(name, _Wait())
        queue = wait.asking or wait.retry_at > time.monotonic()  # the limit was found full just now
    holder_body = None
    if holder is not None:
        from prefect.client.schemas.objects import ConcurrencyLeaseHolder

        holder_body = ConcurrencyLeaseHolder(type="task_run", id=holder)
    if not queue:
        got = _ask(name, lease_seconds, holder_body, wait)
        if got is not _FULL:
            return got
    while True:  # wait for a spare, or for this prompt's turn to ask the server
        with _leases_lock:
            while True:
                lease = _take_spare(name)
                if lease is not None:
                    return lease
                cancel.check_cancelled()
                now = time.monotonic()
                if not wait.asking and now >= wait.retry_at:
                    wait.asking = True
                    break
                _spare_ready.wait(_WAIT_SLICE if wait.asking else min(_WAIT_SLICE, wait.retry_at - now))
        try:
            got = _ask(name, lease_seconds, holder_body, wait)
        finally:
            with _leases_lock:
                wait.asking = False
                _spare_ready.notify_all()
        if got is not _FULL:
            return got


_FULL = object()  # _ask's answer when the limit is full (the server's Retry-After is in wait.retry_at)


def _ask(name: str, lease_seconds: float, holder_body: Any, wait: _Wait) -> Any:
    """One request for a slot: its (tracked) lease; None when the limit does not exist; :data:`_FULL`
    when no slot is free (``wait.retry_at`` is then when to ask again, from the server's ``Retry-After``)."""
    import httpx

    cancel.check_cancelled()
    try:
        _count("acquire")
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
        _count("locked")
        after = min(max(float(exc.response.headers.get("Retry-After", 1.0)), 0.05), _MAX_RETRY_AFTER)
        with _leases_lock:
            wait.retry_at = max(wait.retry_at, time.monotonic() + after)
        return _FULL
    body = reply.json()
    if not body.get("limits"):
        if name not in _missing_warned:
            _missing_warned.add(name)
            logger.warning(
                "global concurrency limit %s does not exist or is inactive: prompts run without a slot", name
            )
        return None
    lease = _Lease(UUID(body["lease_id"]), name, lease_seconds)
    _track(lease)
    return lease


def _schedule(at: float) -> None:
    """Wake the renewal thread if ``at`` (monotonic seconds) comes before its next wake. Call with the lock held."""
    if at < _wake_at:
        _wake.notify()


def _track(lease: _Lease) -> None:
    """Renew ``lease`` from now on (until it is given back), starting the renewal thread once."""
    global _renewer
    with _leases_lock:
        _leases[lease.id] = lease
        _schedule(lease.renew_at)
        if _renewer is None or not _renewer.is_alive():
            _renewer = threading.Thread(target=_renew_forever, name="hermes-lease-renewal", daemon=True)
            _renewer.start()


def _due_work() -> tuple[list[_Lease], list[_Lease]]:
    """Sleep until something is due; then ``(spares to release, leases to renew)``, the spares taken out
    of the pools. Call with the lock held (the wait releases it)."""
    global _wake_at
    while True:
        now = time.monotonic()
        stopped = cancel.is_cancelled()
        expired = [
            lease
            for pool in _spares.values()
            for lease in pool
            if stopped or lease.spare_until is not None and lease.spare_until <= now
        ]
        for lease in expired:
            _spares[lease.name].remove(lease)
            _leases.pop(lease.id, None)
        due = [lease for lease in _leases.values() if lease.renew_at <= now]
        if expired or due:
            _wake_at = -math.inf
            return expired, due
        wake_at = min((lease.renew_at for lease in _leases.values()), default=math.inf)
        for pool in _spares.values():
            for lease in pool:
                # a spare: its end of grace, and a look at the run's stop every slice
                wake_at = min(wake_at, lease.spare_until or math.inf, now + _WAIT_SLICE)
        _wake_at = wake_at
        _wake.wait(None if wake_at == math.inf else wake_at - now)


def _renew_forever() -> None:
    """Renew each lease half a lease after its last renewal; release the spares whose grace is over."""
    while True:
        with _leases_lock:
            expired, due = _due_work()
        for lease in expired:
            _release(lease)
        for lease in due:
            now = time.monotonic()
            try:
                _count("renew")
                _api().renew_concurrency_lease(lease_id=lease.id, lease_duration=lease.seconds)
            except Exception as exc:  # noqa: BLE001 - one failure must not stop the other renewals
                gone = getattr(getattr(exc, "response", None), "status_code", None) in (404, 410)
                with _leases_lock:
                    mine = _leases.get(lease.id) is lease
                    lease.renew_at = now + lease.seconds / 4
                    if gone and mine:  # expired or revoked on the server: nothing left to renew
                        _leases.pop(lease.id, None)
                        if lease.spare_until is not None:
                            _spares[lease.name].remove(lease)
                if mine:  # (not: it was given back meanwhile)
                    logger.warning(
                        "could not renew a concurrency lease (%s)%s",
                        exc,
                        ": its slot is free on the server, the limit may be passed until the prompt ends"
                        if gone
                        else "; trying again in a quarter lease",
                    )
                continue
            with _leases_lock:
                lease.renew_at = now + lease.seconds / 2


def release_spare_slots() -> int:
    """Give back every spare lease of this process at once (one request each); returns how many.

    Call it when the run's prompts are done, so its slots do not wait out the grace. Prompts still
    running keep theirs; a prompt ending later spares its lease as usual. Failures are logged.
    """
    with _leases_lock:
        spares = [lease for pool in _spares.values() for lease in pool]
        _spares.clear()
        for lease in spares:
            _leases.pop(lease.id, None)
    for lease in spares:
        _release(lease)
    return len(spares)


atexit.register(release_spare_slots)


def server_calls() -> dict[str, int]:
    """Requests this process sent for slots so far: ``{"acquire", "locked", "renew", "release"}`` counts
    (``acquire`` counts every attempt, ``locked`` those answered 423: no slot free). Handovers are
    not requests: :func:`handovers`."""
    with _calls_lock:
        return {kind: _calls[kind] for kind in ("acquire", "locked", "renew", "release")}


def handovers() -> int:
    """Slots prompts of this process took from a spare lease (no request) so far."""
    with _calls_lock:
        return _calls["handover"]


def held_leases() -> int:
    """Leases this process holds now, held by prompts or spare (for tests and the live display)."""
    with _leases_lock:
        return len(_leases)


def spare_leases() -> int:
    """Spare leases of this process now (a prompt ended, none took the slot yet)."""
    with _leases_lock:
        return sum(len(pool) for pool in _spares.values())


__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "HANDOVER_GRACE_SECONDS",
    "HANDOVER_MAX_AGE_SECONDS",
    "close_api_client",
    "handovers",
    "held_leases",
    "hold_slot",
    "open_api_client",
    "release_spare_slots",
    "server_calls",
    "spare_leases",
]
