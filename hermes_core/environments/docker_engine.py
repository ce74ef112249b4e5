"""The Docker engine as the docker backend uses it: the shared client, image checks, container reaping.

One module for everything about the engine itself (``hermes_core.environments.docker`` is the
per-prompt sandbox): :func:`docker_client` (the process's client of ``DOCKER_HOST``),
:func:`ping_engine`, :func:`check_images` / :func:`ensure_image` (present locally -> go; absent
-> pull, bounded, or fail), :func:`reap_run_containers` (leftovers of a crashed run, by the run
folder's id) and the registry of the containers this process owns (removed at exit).

Engine facts this follows (measured, see docs/sandboxes.md): ``docker.from_env()`` honours
``DOCKER_HOST``; an unreachable engine raises ``DockerException`` or
``requests.exceptions.ConnectionError`` (both in :data:`ENGINE_ERRORS`); ``containers.create``
raises ``ImageNotFound`` for a missing image.

Examples:
    >>> check_images(["hermes-test/busybox:1", "no/such:image"], HermesSettings(docker_pull=False))  # doctest: +SKIP
    {'no/such:image': "container image 'no/such:image' is not available: not present locally and pulling is off (HERMES_DOCKER_PULL)"}
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterable

import docker
import docker.errors
import requests
from docker.utils import parse_repository_tag

from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings

logger = logging.getLogger(__name__)

LABEL_RUN = "hermes-batch.run"
LABEL_RUN_ID = "hermes-batch.run-id"
LABEL_PROMPT = "hermes-batch.prompt"
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)
"""What a call to the engine raises when the engine (not the request) fails."""


class EngineUnavailable(SandboxError):
    """The Docker engine cannot be reached (not running, wrong ``DOCKER_HOST``, no permission)."""


class ImageUnavailable(SandboxError):
    """A container image is not present locally and could not be pulled.

    Attributes:
        image: the image reference as the record (or the default setting) named it.
    """

    def __init__(self, image: str, reason: str):
        super().__init__(f"container image {image!r} is not available: {reason}")
        self.image = image


_clients: dict[str, docker.DockerClient] = {}
_clients_lock = threading.Lock()


def docker_client() -> docker.DockerClient:
    """The process's client of the engine named by ``DOCKER_HOST`` (default socket otherwise), shared by threads.

    Raises:
        EngineUnavailable: the engine does not answer; the message names the address tried.
    """
    host = os.environ.get("DOCKER_HOST", "")
    with _clients_lock:
        client = _clients.get(host)
        if client is None:
            try:
                client = docker.from_env(max_pool_size=64)
                client.ping()
            except ENGINE_ERRORS as exc:
                raise EngineUnavailable(
                    f"Docker engine not reachable at {host or 'the default socket'} (set DOCKER_HOST): {exc}"
                ) from None
            _clients[host] = client
    return client


def ping_engine() -> str:
    """Check that the engine answers now; return its version (e.g. ``"20.10.24+dfsg1"``).

    Raises:
        EngineUnavailable: no answer.
    """
    client = docker_client()
    try:
        return str(client.version().get("Version", "unknown"))
    except ENGINE_ERRORS as exc:
        raise EngineUnavailable(f"Docker engine stopped answering: {exc}") from None


def reap_run_containers(run_id: str) -> list[str]:
    """Force-remove every container labelled ``hermes-batch.run-id=<run_id>`` (left by a crashed run).

    Call it before a run starts its prompts: it does not spare containers of a run in progress
    with the same run folder. Containers of other run folders (even with the same run name)
    are left alone.

    Args:
        run_id: the run folder's unique id (stored in its run.json); must not be empty.

    Returns:
        Short ids of the removed containers.

    Raises:
        ValueError: ``run_id`` is empty (it would match nothing useful).
        EngineUnavailable: the engine cannot be reached.
    """
    if not run_id:
        raise ValueError("reap_run_containers needs the run folder's run_id (empty given)")
    client = docker_client()
    try:
        # ignore_removed: one removed between the SDK's listing and its inspection (an earlier
        # invocation still tearing down) is not an engine failure
        found = client.containers.list(
            all=True, filters={"label": f"{LABEL_RUN_ID}={run_id}"}, ignore_removed=True
        )
    except ENGINE_ERRORS as exc:
        raise EngineUnavailable(f"cannot list containers: {exc}") from None
    removed = []
    for container in found:
        try:
            container.remove(force=True)
            removed.append(container.short_id)
        except docker.errors.NotFound:
            pass
        except ENGINE_ERRORS as exc:
            logger.warning("could not remove leftover container %s: %s", container.short_id, exc)
    return removed


_slots: dict[int, threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


def start_slots(n: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore bounding container creations to ``n`` at once.

    It is held only around create + start, never while a prompt runs, so the prompt pool
    cannot deadlock on it.
    """
    with _slots_lock:
        return _slots.setdefault(n, threading.BoundedSemaphore(n))


_live: dict[str, docker.models.containers.Container] = {}
_live_lock = threading.Lock()


@atexit.register
def _remove_live_containers() -> None:
    """At interpreter exit (Ctrl-C included), remove the containers this process still owns."""
    with _live_lock:
        containers = list(_live.values())
        _live.clear()
    for container in containers:
        try:
            container.remove(force=True)
        except Exception:  # noqa: BLE001 - best effort at exit; the next run reaps what is left
            pass


def own_container(container) -> None:
    """Register ``container`` as owned by this process: it is removed at interpreter exit if still there."""
    with _live_lock:
        _live[container.id] = container


def remove_container(container) -> None:
    """Force-remove ``container`` and forget it; a container already gone is fine. Never raises."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except Exception as exc:  # noqa: BLE001 - teardown never raises; the next run reaps it
        logger.warning("could not remove container %s: %s", container.short_id, exc)
    with _live_lock:
        _live.pop(container.id, None)


# -- images ------------------------------------------------------------------------------

_ready: set[tuple[str, str]] = set()
"""(engine base URL, image) pairs known present in this process."""
_ready_lock = threading.Lock()
_image_locks: dict[str, threading.Lock] = {}


def _present(client: docker.DockerClient, image: str) -> bool:
    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False
    except ENGINE_ERRORS as exc:
        raise EngineUnavailable(f"Docker engine failed while looking up {image!r}: {exc}") from None


def _pull(client: docker.DockerClient, image: str, timeout: float) -> str | None:
    """Pull ``image``, waiting at most ``timeout`` seconds; None on success, else the reason."""
    repository, tag = parse_repository_tag(image)
    outcome: list[str | None] = []

    def work() -> None:
        try:
            client.images.pull(repository, tag=tag or "latest")
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - reported as the reason the image is unavailable
            outcome.append(f"pull failed: {getattr(exc, 'explanation', None) or exc}")

    worker = threading.Thread(target=work, name=f"pull {image}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return f"pull did not finish within {timeout:g} s (HERMES_DOCKER_PULL_TIMEOUT)"
    return outcome[0] if outcome else "pull failed"


def ensure_image(image: str, settings: HermesSettings | None = None) -> None:
    """Make sure ``image`` is present in the engine: look it up, pull it when allowed.

    Successes are remembered for the process, so a run pays the check once per image.
    Concurrent callers for the same image wait for one pull.

    Raises:
        ImageUnavailable: absent and pulling is off, or the pull failed or timed out.
        EngineUnavailable: the engine cannot be reached.
    """
    settings = settings or HermesSettings()
    client = docker_client()
    key = (client.api.base_url, image)
    if key in _ready:
        return
    with _ready_lock:
        lock = _image_locks.setdefault(image, threading.Lock())
    with lock:
        if key in _ready:
            return
        if not _present(client, image):
            if not settings.docker_pull:
                raise ImageUnavailable(image, "not present locally and pulling is off (HERMES_DOCKER_PULL)")
            reason = _pull(client, image, settings.docker_pull_timeout)
            if reason is not None:
                raise ImageUnavailable(image, f"not present locally; {reason}")
            if not _present(client, image):
                raise ImageUnavailable(image, "not present after pulling")
        with _ready_lock:
            _ready.add(key)


def check_images(images: Iterable[str], settings: HermesSettings | None = None) -> dict[str, str]:
    """Check each distinct image once (pulling when allowed).

    Returns:
        ``{image: reason}`` for the images that cannot be used; empty when all are ready.

    Raises:
        EngineUnavailable: the engine cannot be reached (no point checking per image).
    """
    settings = settings or HermesSettings()
    docker_client()  # one clear error when the engine is down
    problems: dict[str, str] = {}
    for image in dict.fromkeys(images):
        try:
            ensure_image(image, settings)
        except ImageUnavailable as exc:
            problems[image] = str(exc)
    return problems


__all__ = [
    "ENGINE_ERRORS",
    "LABEL_PROMPT",
    "LABEL_RUN",
    "LABEL_RUN_ID",
    "EngineUnavailable",
    "ImageUnavailable",
    "check_images",
    "docker_client",
    "ensure_image",
    "ping_engine",
    "own_container",
    "reap_run_containers",
    "remove_container",
    "start_slots",
]
