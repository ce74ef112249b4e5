"""Settings of hermes_core, read from the environment and an optional ``.env``.

Reference variable names are kept (``OPENROUTER_API_KEY``, ``OPENAI_API_KEY``,
``TERMINAL_ENV``, ``TERMINAL_TIMEOUT``, ``TERMINAL_DOCKER_IMAGE``) so users of
the reference batch runner can switch; our own knobs use the ``HERMES_`` prefix.
The API key is a :class:`~pydantic.SecretStr`: it is never printed, logged or
serialised in clear (``model_dump`` shows ``**********``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

TerminalBackend = Literal["local", "docker", "singularity", "modal"]


class HermesSettings(BaseSettings):
    """Process-wide settings. Build with keyword arguments to override the environment.

    Examples:
        >>> HermesSettings(terminal_timeout=30).terminal_timeout
        30
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("api_key", "OPENROUTER_API_KEY", "OPENAI_API_KEY"),
        description="Model API key: OPENROUTER_API_KEY, else OPENAI_API_KEY. Never serialised in clear.",
    )
    base_url: str = Field(
        default="https://openrouter.ai/api/v1",
        validation_alias=AliasChoices("base_url", "HERMES_BASE_URL"),
        description="OpenAI-compatible endpoint of the model API.",
    )
    terminal_env: TerminalBackend = Field(
        default="local",
        validation_alias=AliasChoices("terminal_env", "TERMINAL_ENV"),
        description="Sandbox backend of each prompt: local, docker, singularity or modal.",
    )
    terminal_timeout: int = Field(
        default=180,
        ge=1,
        validation_alias=AliasChoices("terminal_timeout", "TERMINAL_TIMEOUT"),
        description="Default timeout of one terminal command, seconds.",
    )
    terminal_max_foreground_timeout: int = Field(
        default=600,
        ge=1,
        validation_alias=AliasChoices("terminal_max_foreground_timeout", "TERMINAL_MAX_FOREGROUND_TIMEOUT"),
        description="Largest timeout a foreground terminal command may ask for, seconds.",
    )
    terminal_docker_image: str = Field(
        default="nikolaik/python-nodejs:python3.11-nodejs20",
        validation_alias=AliasChoices("terminal_docker_image", "TERMINAL_DOCKER_IMAGE"),
        description="Container image of prompts whose record names none (docker, singularity, modal).",
    )
    terminal_output_max_chars: int = Field(
        default=50_000,
        ge=1000,
        validation_alias=AliasChoices("terminal_output_max_chars", "HERMES_TERMINAL_OUTPUT_MAX_CHARS"),
        description="Bound of a terminal result's output; longer output keeps the first 40% and last 60%.",
    )
    tool_result_max_chars: int = Field(
        default=100_000,
        ge=1000,
        validation_alias=AliasChoices("tool_result_max_chars", "HERMES_TOOL_RESULT_MAX_CHARS"),
        description="Bound of any tool result (file tools included), characters.",
    )
    request_timeout: float = Field(
        default=600.0,
        gt=0,
        validation_alias=AliasChoices("request_timeout", "HERMES_REQUEST_TIMEOUT"),
        description="Timeout of one model API request, seconds.",
    )
    max_retries: int = Field(
        default=5,
        ge=0,
        validation_alias=AliasChoices("max_retries", "HERMES_MAX_RETRIES"),
        description="Retries of one model request on 429, 5xx, timeouts and connection errors.",
    )
