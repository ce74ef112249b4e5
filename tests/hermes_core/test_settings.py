"""hermes_core.settings: which environment names are read, and construction by field name."""

from __future__ import annotations

import pytest

from hermes_core.settings import HermesSettings, ModelEndpointSettings, SandboxSettings

KEY_NAMES = ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "HERMES_API_KEY")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No hermes or reference variable in the environment, and no ``.env`` in the working folder."""
    monkeypatch.chdir(tmp_path)
    for name in (
        *KEY_NAMES,
        "HERMES_BASE_URL",
        "HERMES_MAX_RETRIES",
        "TERMINAL_TIMEOUT",
        "HERMES_TERMINAL_TIMEOUT",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_generic_names_in_the_environment_are_never_read(clean_env):
    clean_env.setenv("API_KEY", "sk-generic-0123456789")
    clean_env.setenv("BASE_URL", "http://generic.invalid/v1")
    clean_env.setenv("MAX_RETRIES", "9")
    clean_env.setenv("SANDBOX_NETWORK", "host")
    settings = HermesSettings()
    assert settings.api_key is None
    assert settings.base_url == "https://openrouter.ai/api/v1"
    assert settings.max_retries == 5
    assert settings.sandbox_network == "outbound"


def test_documented_reference_and_prefixed_names_are_read(clean_env):
    clean_env.setenv("OPENAI_API_KEY", "sk-openai-0123456789")
    clean_env.setenv("HERMES_BASE_URL", "http://127.0.0.1:9/v1")
    clean_env.setenv("TERMINAL_TIMEOUT", "77")
    clean_env.setenv("HERMES_SANDBOX_NETWORK", "false")
    settings = HermesSettings()
    assert settings.api_key.get_secret_value() == "sk-openai-0123456789"
    assert settings.base_url == "http://127.0.0.1:9/v1"
    assert settings.terminal_timeout == 77
    assert settings.sandbox_network == "none"
    clean_env.delenv("TERMINAL_TIMEOUT")
    clean_env.setenv("HERMES_TERMINAL_TIMEOUT", "55")  # HERMES_<field name>
    assert SandboxSettings().terminal_timeout == 55


def test_keyword_arguments_use_the_field_names(clean_env):
    settings = HermesSettings(
        api_key="sk-kw-0123456789", terminal_timeout=30, sandbox_network=True, cwd_roots="/a, /b,,"
    )
    assert settings.api_key.get_secret_value() == "sk-kw-0123456789"
    assert (settings.terminal_timeout, settings.sandbox_network, settings.cwd_roots) == (
        30,
        "outbound",
        ["/a", "/b"],
    )
    assert ModelEndpointSettings(max_retries=0).max_retries == 0
