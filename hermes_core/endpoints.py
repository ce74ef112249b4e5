"""Where a run's model requests go, which key they carry and where its commands run: one resolver.

Preflight (the command line's checks before anything is spent), the flow and the runner all
ask these functions, so they cannot disagree (e.g. about ``HERMES_BASE_URL``).
"""

from __future__ import annotations

from pydantic import SecretStr

from hermes_core.exceptions import ConfigError
from hermes_core.mockllm._options import is_mock_model
from hermes_core.settings import HermesSettings

MOCK_ENDPOINT = "the built-in mock model server"
"""How :func:`resolve_base_url` names the mock server when asked not to start it."""


def is_local_endpoint(url: str) -> bool:
    """True for an endpoint on this machine (127.0.0.1, localhost): it may take no API key."""
    return "://127.0.0.1" in url or "://localhost" in url


def resolve_base_url(
    model: str, base_url: str | None, settings: HermesSettings, *, start_mock: bool = True
) -> str:
    """The endpoint of a run: the explicit one, else the built-in mock server for ``mock/`` models,
    else ``settings.base_url`` (``HERMES_BASE_URL``, default OpenRouter).

    Args:
        start_mock: start the process's mock server if needed (False: return :data:`MOCK_ENDPOINT`).
    """
    if base_url:
        return base_url
    if is_mock_model(model):
        if not start_mock:
            return MOCK_ENDPOINT
        from hermes_core.mockllm import ensure_mock_server

        return ensure_mock_server()
    return settings.base_url


def require_key(base_url: str, key: SecretStr | None) -> str:
    """The key to send to ``base_url``: ``key``, or a placeholder for a local endpoint without one.

    Raises:
        ConfigError: no key for an endpoint that is not on this machine (the message says how to give one).
    """
    value = key.get_secret_value() if key else ""
    if value:
        return value
    if base_url == MOCK_ENDPOINT or is_local_endpoint(base_url):
        return "local-no-key"
    raise ConfigError(
        f"no API key for {base_url}: set OPENROUTER_API_KEY or OPENAI_API_KEY, or pass --api_key"
    )


def resolve_backend(terminal_env: str | None, settings: HermesSettings) -> str:
    """The sandbox backend of a run: the explicit one, else ``settings.terminal_env`` (``TERMINAL_ENV``, local)."""
    return terminal_env or settings.terminal_env


__all__ = ["MOCK_ENDPOINT", "is_local_endpoint", "require_key", "resolve_backend", "resolve_base_url"]
