"""The environment variables a sandbox command gets: an allow-list, never the host's environment.

Local commands (plain and bubblewrap) get :data:`LOCAL_NAMES` (and ``LC_*``) from the host, ``HOME``
set to the prompt's folder, and the names listed in ``HERMES_SANDBOX_ENV``; containers get
their image's environment plus only the listed names (:func:`listed_environment`). API keys,
cloud credentials, ``PREFECT_*`` and everything else of this process stay out.

Examples:
    >>> from hermes_core.settings import HermesSettings
    >>> env = local_environment("/tmp/p", HermesSettings(sandbox_env=[]), source={"PATH": "/bin", "AWS_SECRET": "x"})
    >>> sorted(env)
    ['HOME', 'LANG', 'PATH', 'TERM']
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hermes_core.settings import HermesSettings

LOCAL_NAMES = ("PATH", "LANG", "TERM", "TZ", "TMPDIR", "USER", "SHELL")
"""Host variables a local command keeps (besides ``LC_*``); ``HOME`` is always the prompt's folder."""

_DEFAULTS = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb"}


def listed_environment(settings: HermesSettings, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables named in ``settings.sandbox_env`` (``HERMES_SANDBOX_ENV``) with their values in ``source``.

    Args:
        settings: gives the names.
        source: where values come from; default this process's ``os.environ``. A listed name
            absent from it is left out.

    Returns:
        ``{name: value}`` in the order listed.
    """
    source = os.environ if source is None else source
    return {name: source[name] for name in settings.sandbox_env if name in source}


def local_environment(
    home: str,
    settings: HermesSettings,
    tmpdir: str | None = None,
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of a local command: the allow-list, the listed names, ``HOME=home``.

    Args:
        home: absolute path of the prompt's folder (the command's ``HOME``).
        settings: ``sandbox_env`` names the extra variables.
        tmpdir: ``TMPDIR`` to set (the bubblewrap sandbox uses ``/tmp``); None keeps the host's, if any.
        source: the host environment; default ``os.environ``.

    Returns:
        A new dict; ``PATH``, ``LANG`` and ``TERM`` always present (defaults
        ``/usr/local/bin:/usr/bin:/bin``, ``C.UTF-8``, ``dumb``).
    """
    source = os.environ if source is None else source
    env = {name: source[name] for name in LOCAL_NAMES if name in source}
    env.update((name, value) for name, value in source.items() if name.startswith("LC_"))
    for name, value in _DEFAULTS.items():
        env.setdefault(name, value)
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    env.update(listed_environment(settings, source))
    env["HOME"] = home
    return env


__all__ = ["LOCAL_NAMES", "listed_environment", "local_environment"]
