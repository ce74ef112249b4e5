"""Per-prompt sandboxes behind one small protocol, chosen by name and imported lazily.

Every backend implements :class:`Environment`; none inherits from it. Backends:
``local`` (a fresh temporary directory per prompt, in a bubblewrap sandbox when bwrap
works here, else plain subprocesses: :func:`isolation_warning`), ``docker`` (a container per prompt), ``singularity`` (an Apptainer
instance per prompt) and ``modal`` (a Modal Sandbox per prompt); see docs/sandboxes.md.

Examples:
    >>> with create_environment("local") as env:
    ...     env.execute("echo hi").output
    'hi\\n'
"""

from __future__ import annotations

import importlib
import posixpath
import threading
from dataclasses import dataclass
from typing import Any, Protocol, get_args, runtime_checkable

from hermes_core.exceptions import ConfigError
from hermes_core.settings import HermesSettings, TerminalBackend


@dataclass(frozen=True, slots=True)
class ExecResult:
    """Outcome of one command.

    Attributes:
        returncode: exit status; 124 when the command timed out.
        output: merged stdout and stderr, decoded as UTF-8 (invalid bytes replaced),
            bounded by the backend's output limit.
        truncated: True when output was cut to the bound.
        timed_out: True when the command was killed at its timeout.
    """

    returncode: int
    output: str
    truncated: bool = False
    timed_out: bool = False


@runtime_checkable
class Environment(Protocol):
    """The sandbox of one prompt.

    ``cwd`` is the absolute working directory inside the environment. Relative
    paths given to :meth:`read_file` / :meth:`write_file` are relative to it.
    Teardown is :meth:`close`, in every backend; using the environment as a
    context manager calls :meth:`start` and, always, :meth:`close`.
    """

    cwd: str

    def start(self) -> None:
        """Create the sandbox. Raises SandboxError when it cannot be created."""

    def execute(self, command: str, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        """Run ``command`` with ``sh -c`` in ``cwd`` (default: the environment's cwd).

        Timeout in seconds (None = the backend default); on timeout the whole
        process tree is killed and returncode is 124. Raises SandboxError when
        the sandbox itself is broken, never for a failing command.
        """

    def read_file(self, path: str) -> bytes:
        """Return the file's bytes. Raises FileNotFoundError, IsADirectoryError, PermissionError."""

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path``, creating parent directories."""

    def close(self, interrupted: bool = False) -> None:
        """Tear down: kill every process and remove what the sandbox created. Idempotent."""

    def __enter__(self) -> Environment: ...

    def __exit__(self, *exc: object) -> None: ...


class SandboxLifecycle:
    """Context-manager use shared by every backend: ``start()`` on enter, ``close(interrupted)`` always on exit."""

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close(interrupted=exc is not None)


CONTAINER_WORKDIR = "/workspace"
"""Working directory of container-like backends when the record names no ``cwd``."""


def container_cwd(cwd: str | None) -> str:
    """The absolute working directory of a container-like sandbox (relative ``cwd`` is under /workspace)."""
    return posixpath.normpath(posixpath.join(CONTAINER_WORKDIR, cwd)) if cwd else CONTAINER_WORKDIR


def container_image(image: str | None, settings: HermesSettings) -> str:
    """The image of a prompt's container: the record's ``image`` / ``docker_image``, else ``TERMINAL_DOCKER_IMAGE``."""
    return image or settings.terminal_docker_image


class ContainerSandbox(SandboxLifecycle):
    """What the container-like backends (docker, singularity, modal) share: their arguments.

    Args:
        cwd: working directory inside the sandbox; relative paths are taken under ``/workspace``
            (:func:`container_cwd`). None: ``/workspace``.
        image: image of the sandbox; None: ``settings.terminal_docker_image``.
        settings: default ``HermesSettings()``.
        run_name, prompt_id: the run and prompt the sandbox belongs to (labels, logs).
        run_id: unique id of the run folder (its run.json), so that leftovers are reaped per
            run folder, not per run name (docker's ``hermes-batch.run-id`` label).
        **_ignored: options of other backends, accepted and ignored.
    """

    def __init__(
        self,
        cwd: str | None = None,
        image: str | None = None,
        settings: HermesSettings | None = None,
        run_name: str = "",
        prompt_id: str | int = "",
        run_id: str = "",
        **_ignored: object,
    ):
        self.settings = settings or HermesSettings()
        self.image = container_image(image, self.settings)
        self.cwd = container_cwd(cwd)
        self.run_name = run_name
        self.prompt_id = str(prompt_id)
        self.run_id = run_id
        self._closed = False
        self._state_lock = threading.Lock()


BACKENDS: dict[str, str] = {
    name: f"hermes_core.environments.{name}:{name.capitalize()}Environment"
    for name in get_args(TerminalBackend)
}
"""Backend name (:data:`~hermes_core.settings.TerminalBackend`, the one list) -> ``module:Class``;
modules are imported only when chosen."""


def create_environment(backend: str, **kwargs: Any) -> Environment:
    """Build (not start) the environment of one prompt.

    Args:
        backend: a key of :data:`BACKENDS`.
        **kwargs: passed to the backend's constructor (``cwd``, ``image``, ``settings``,
            ``run_name``, ``run_id``, ``prompt_id`` ...); every backend accepts them all.

    Raises:
        ConfigError: unknown backend name (the message lists the choices).
    """
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise ConfigError(
            f"unknown terminal backend {backend!r}; choose one of {', '.join(sorted(BACKENDS))}"
        ) from None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)(**kwargs)


from hermes_core.environments.isolation import (  # noqa: E402 - needs the classes above
    isolation_refusal,
    isolation_warning,
    network_warning,
)

__all__ = [
    "BACKENDS",
    "CONTAINER_WORKDIR",
    "Environment",
    "ExecResult",
    "ContainerSandbox",
    "SandboxLifecycle",
    "container_cwd",
    "container_image",
    "create_environment",
    "isolation_refusal",
    "isolation_warning",
    "network_warning",
]
