"""Whether the local backend isolates its commands with bubblewrap, and the warning when it cannot.

``HERMES_LOCAL_ISOLATION``: ``auto`` (default) uses bubblewrap when ``bwrap`` is installed and
can build a sandbox here (probed once per process), else plain subprocesses; ``bwrap``
requires it; ``none`` opts out. :func:`isolation_warning` gives the text a run shows once
when ``auto`` falls back. Inside a container (a flow run of a Docker work pool, a Kubernetes pod)
``auto`` never falls back: Docker's default seccomp profile denies the namespaces bubblewrap needs,
and the container usually holds the Docker socket and the provider key, so plain subprocesses would
hand both to the model. :func:`isolation_refusal` gives the reason the run then stops before any
prompt, recommending ``--terminal_env=docker``.

Examples:
    >>> from hermes_core.settings import HermesSettings
    >>> isolation_warning("docker", HermesSettings()) is None
    True
"""

from __future__ import annotations

import functools
import os
import shutil

from hermes_core.environments.programs import find_program
from hermes_core.environments.scratch import make_temp_dir
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate commands here, or None when it can.

    Probes once per process (and per ``bwrap`` path) by starting a real sandbox with the
    options the local backend uses and running ``true`` in it.

    Returns:
        None when a sandbox works; else a one-line reason (not installed, or bubblewrap's error).
    """
    path = find_program("bwrap")
    if not path:
        return "bwrap is not installed"
    return _probe(path, "none")


@functools.lru_cache(maxsize=8)
def _probe(bwrap: str, network: str) -> str | None:
    from hermes_core.environments.bwrap import BwrapSandbox

    home = make_temp_dir("hermes-probe-")
    tmp = make_temp_dir("hermes-probe-tmp-")
    sandbox = BwrapSandbox(bwrap, home, tmp, {"PATH": "/usr/bin:/bin"}, network=network)
    try:
        sandbox.start()
        sandbox.ensure_network()  # with the native agent a command without a socket would not
        proc = sandbox.spawn(["/bin/sh", "-c", "true"], home, {})
        os.close(proc.fd)
        try:
            code = proc.wait(timeout=30)
        finally:
            proc.done()
        return None if code == 0 else f"a command in the sandbox exited with {code}"
    except (SandboxError, OSError) as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - the probe must answer, not raise
        return f"{type(exc).__name__}: {exc}"
    finally:
        sandbox.close()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def outbound_problem() -> str | None:
    """Why sandboxes cannot have the outbound network here (slirp4netns), or None when they can.

    Probes once per process by starting a real sandbox with it (after :func:`bwrap_problem`).
    """
    from hermes_core.environments.outbound import slirp4netns_path

    bwrap = find_program("bwrap")
    if not bwrap:
        return "bwrap is not installed"
    if not slirp4netns_path():
        return "slirp4netns is not installed (apt-get install slirp4netns)"
    return _probe(bwrap, "outbound")


def sandbox_network(settings: HermesSettings) -> str:
    """The network a bubblewrap sandbox gets: ``settings.sandbox_network``, except ``outbound`` -> ``none``
    where slirp4netns cannot run (deny by default: never the host's network in its place)."""
    mode = settings.sandbox_network
    if mode == "outbound" and outbound_problem() is not None:
        return "none"
    return mode


def network_warning(backend: str, settings: HermesSettings) -> str | None:
    """The warning to show once per run when sandboxes get less network than asked, or None."""
    if backend != "local" or settings.sandbox_network != "outbound" or not uses_bwrap(settings):
        return None
    problem = outbound_problem()
    if problem is None:
        return None
    return (
        f"Sandboxes have NO network ({problem}): HERMES_SANDBOX_NETWORK=outbound needs slirp4netns, "
        "and the host's network is never shared in its place. Fix: apt-get install slirp4netns; set "
        "HERMES_SANDBOX_NETWORK=none to run without network and without this warning."
    )


def uses_bwrap(settings: HermesSettings) -> bool:
    """True when the local backend runs commands in bubblewrap under ``settings.local_isolation``.

    ``none`` -> False; ``bwrap`` -> True (whether or not it works: the prompt then fails);
    ``auto`` -> True exactly when :func:`bwrap_problem` finds none.
    """
    if settings.local_isolation == "none":
        return False
    if settings.local_isolation == "bwrap":
        return True
    return bwrap_problem() is None


CONTAINER_MARKERS: tuple[tuple[str, str], ...] = (("/.dockerenv", "docker"), ("/run/.containerenv", "podman"))
"""The files container runtimes put at the root of a container, and the runtime each one names."""


def container_runtime() -> str | None:
    """The container this process runs in (``docker``, ``podman``, ``kubernetes``, or the value of
    ``$container``), or None on a plain host.

    Signs read (the runtimes' own markers): :data:`CONTAINER_MARKERS` (``/.dockerenv``: Docker,
    ``/run/.containerenv``: Podman), ``KUBERNETES_SERVICE_HOST`` (a Kubernetes pod), ``$container``
    (systemd-nspawn, LXC).
    """
    for marker, runtime in CONTAINER_MARKERS:
        if os.path.exists(marker):
            return runtime
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    return os.environ.get("container") or None


def isolation_refusal(backend: str, settings: HermesSettings) -> str | None:
    """Why this run must not start, or None: ``auto`` isolation inside a container without bubblewrap.

    Args:
        backend: the run's terminal backend; only ``local`` can be refused.
        settings: ``local_isolation`` (``HERMES_LOCAL_ISOLATION``); ``bwrap`` and ``none`` are
            explicit choices and never refused here.

    Returns:
        None outside a container, for other backends and settings, or when bubblewrap works; else
        the reason and the fixes, one paragraph (the flow raises it before any prompt).
    """
    if backend != "local" or settings.local_isolation != "auto":
        return None
    runtime = container_runtime()
    if runtime is None:
        return None
    problem = bwrap_problem()
    if problem is None:
        return None
    return (
        f"terminal_env=local cannot isolate commands in this {runtime} container ({problem}): "
        "a container's default seccomp profile denies the namespaces bubblewrap needs, and without "
        "them every command of the model would run inside this container, next to the API key "
        "and the Docker socket. Use terminal_env=docker (with the host's Docker socket mounted, as "
        "the generate-docker deployment does): each prompt then gets its own sibling container. "
        "HERMES_LOCAL_ISOLATION=none runs plain subprocesses anyway (the model can read this "
        "container's environment)."
    )


def isolation_warning(backend: str, settings: HermesSettings) -> str | None:
    """The warning to show once per run when local commands run without isolation, or None.

    Args:
        backend: the run's terminal backend (``local``, ``docker``, ...); only ``local`` can warn.
        settings: ``local_isolation`` (``HERMES_LOCAL_ISOLATION``).

    Returns:
        None when the backend is not local, isolation is on, it is required (``bwrap``: prompts
        fail instead), or it was turned off explicitly (``none``). Otherwise (``auto`` without a
        working bubblewrap) a text naming the risk, the reason and the fixes.
    """
    if backend != "local" or settings.local_isolation != "auto" or isolation_refusal(backend, settings):
        return None
    problem = bwrap_problem()
    if problem is None:
        return None
    return (
        f"Local sandbox isolation is OFF ({problem}): every command of the model runs as a plain "
        "subprocess with this user's rights, so it can read and change your files (home folder, "
        "other prompts' folders, the run folder) and reach the network. Fix: install bubblewrap "
        "(apt-get install bubblewrap), or run in containers (--terminal_env=docker); set "
        "HERMES_LOCAL_ISOLATION=none to accept plain subprocesses without this warning."
    )


__all__ = [
    "CONTAINER_MARKERS",
    "bwrap_problem",
    "container_runtime",
    "isolation_refusal",
    "isolation_warning",
    "network_warning",
    "outbound_problem",
    "sandbox_network",
    "uses_bwrap",
]
