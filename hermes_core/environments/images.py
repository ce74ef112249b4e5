"""Container image checks of the docker backend: present locally -> go; absent -> pull (bounded) or fail.

A run checks each distinct image once (:func:`check_images`) before any prompt talks to the
model; the per-prompt :meth:`DockerEnvironment.start` calls :func:`ensure_image`, which is a
cache hit for an image already checked in this process.

Examples:
    >>> check_images(["hermes-test/busybox:1", "no/such:image"], HermesSettings(docker_pull=False))  # doctest: +SKIP
    {'no/such:image': "container image 'no/such:image' is not available: not present locally and pulling is off (HERMES_DOCKER_PULL)"}
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import docker.errors
from docker.utils import parse_repository_tag

from hermes_core.environments.docker import (
    _ENGINE_ERRORS,
    EngineUnavailable,
    ImageUnavailable,
    docker_client,
)
from hermes_core.settings import HermesSettings

_ready: set[tuple[str, str]] = set()
"""(DOCKER_HOST, image) pairs known present in this process."""
_ready_lock = threading.Lock()
_image_locks: dict[str, threading.Lock] = {}


def _present(client: docker.DockerClient, image: str) -> bool:
    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False
    except _ENGINE_ERRORS as exc:
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


__all__ = ["check_images", "ensure_image"]
