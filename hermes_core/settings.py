"""Settings of hermes_core, read from the environment and an optional ``.env``.

Reference variable names are kept (``OPENROUTER_API_KEY``, ``OPENAI_API_KEY``,
``TERMINAL_ENV``, ``TERMINAL_TIMEOUT``, ``TERMINAL_DOCKER_IMAGE``) so users of
the reference batch runner can switch; our own knobs use the ``HERMES_`` prefix.
Each area is its own model (a component may take just the one it uses) and reads only
its fields' documented names (``validation_alias``) and ``HERMES_<field name>``
(``env_prefix``): a generic ``API_KEY``, ``BASE_URL`` or ``MAX_RETRIES`` in the
environment is never read. Keyword arguments use the field names.
The API key is a :class:`~pydantic.SecretStr`: it is never printed, logged or
serialised in clear (``model_dump`` shows ``**********``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

TerminalBackend = Literal["local", "docker", "singularity", "modal"]
"""The sandbox backends, by name (the one list: ``hermes_core.environments.BACKENDS`` maps each to its class)."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BOOLEAN_WORDS = {"true": "outbound", "1": "outbound", "yes": "outbound", "on": "outbound"} | {
    "false": "none",
    "0": "none",
    "no": "none",
    "off": "none",
}


def _split_commas(value: Any) -> Any:
    """``"a, b,,c"`` -> ``["a", "b", "c"]`` (a list is kept as it is)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split_commas)]
"""A list setting written in the environment as comma-separated values (not JSON)."""


class _Area(BaseSettings):
    """Base of the settings areas: the environment and ``.env``; extra variables ignored."""

    model_config = SettingsConfigDict(
        env_file=".env", env_prefix="HERMES_", extra="ignore", populate_by_name=True
    )


class ModelEndpointSettings(_Area):
    """The model API: endpoint, key, request timeout and retries."""

    api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("OPENROUTER_API_KEY", "OPENAI_API_KEY"),
        description="Model API key: OPENROUTER_API_KEY, else OPENAI_API_KEY. Never serialised in clear.",
    )

    base_url: str = Field(
        default="https://openrouter.ai/api/v1",
        validation_alias=AliasChoices("HERMES_BASE_URL"),
        description="OpenAI-compatible endpoint of the model API.",
    )

    request_timeout: float = Field(
        default=600.0,
        gt=0,
        validation_alias=AliasChoices("HERMES_REQUEST_TIMEOUT"),
        description="Timeout of one model API request, seconds.",
    )

    max_retries: int = Field(
        default=5,
        ge=0,
        validation_alias=AliasChoices("HERMES_MAX_RETRIES"),
        description="Retries of one model request on 429, 5xx, timeouts and connection errors.",
    )


class SandboxSettings(_Area):
    """Per-prompt sandboxes: backend, command timeouts, container limits and images, local isolation."""

    terminal_env: TerminalBackend = Field(
        default="local",
        validation_alias=AliasChoices("TERMINAL_ENV"),
        description="Sandbox backend of each prompt: local, docker, singularity or modal.",
    )

    terminal_timeout: int = Field(
        default=180,
        ge=1,
        validation_alias=AliasChoices("TERMINAL_TIMEOUT"),
        description="Default timeout of one terminal command, seconds.",
    )

    terminal_max_foreground_timeout: int = Field(
        default=600,
        ge=1,
        validation_alias=AliasChoices("TERMINAL_MAX_FOREGROUND_TIMEOUT"),
        description="Largest timeout a foreground terminal command may ask for, seconds.",
    )

    terminal_docker_image: str = Field(
        default="nikolaik/python-nodejs:python3.11-nodejs20",
        validation_alias=AliasChoices("TERMINAL_DOCKER_IMAGE"),
        description="Container image of prompts whose record names none (docker, singularity, modal).",
    )

    container_network: bool = Field(
        default=False,
        validation_alias=AliasChoices(
            "container_network", "HERMES_CONTAINER_NETWORK", "HERMES_DOCKER_NETWORK"
        ),
        description="Give containers a network (docker: the engine's default network; modal: no block). "
        "Off by default: containers have only loopback.",
    )

    container_memory_mb: int = Field(
        default=5120,
        ge=16,
        validation_alias=AliasChoices(
            "container_memory_mb", "HERMES_DOCKER_MEMORY_MB", "TERMINAL_CONTAINER_MEMORY"
        ),
        description="Memory limit of one prompt's container, MiB (swap included: no extra swap).",
    )

    container_cpus: float = Field(
        default=1.0,
        gt=0,
        validation_alias=AliasChoices("HERMES_DOCKER_CPUS", "TERMINAL_CONTAINER_CPU"),
        description="CPU limit of one prompt's container, in cores (fractions allowed).",
    )

    container_pids_limit: int = Field(
        default=512,
        ge=8,
        validation_alias=AliasChoices("HERMES_DOCKER_PIDS_LIMIT"),
        description="Most processes (and threads) alive at once in one prompt's container.",
    )

    docker_pull: bool = Field(
        default=True,
        validation_alias=AliasChoices("HERMES_DOCKER_PULL"),
        description="Pull an image that is not present locally (once per run); off: such prompts fail.",
    )

    docker_pull_timeout: float = Field(
        default=300.0,
        gt=0,
        validation_alias=AliasChoices("HERMES_DOCKER_PULL_TIMEOUT"),
        description="Longest wait for one image pull, seconds; past it the image counts as missing.",
    )

    docker_max_concurrent_starts: int = Field(
        default=4,
        ge=1,
        validation_alias=AliasChoices("HERMES_DOCKER_MAX_CONCURRENT_STARTS"),
        description="Container creations in flight at once in this process (others wait their turn).",
    )

    local_isolation: Literal["none", "bwrap", "auto"] = Field(
        default="auto",
        validation_alias=AliasChoices("HERMES_LOCAL_ISOLATION"),
        description="Local backend: auto (default: one bubblewrap sandbox per prompt when bwrap is installed "
        "and works here, else plain subprocesses and one warning per run), bwrap (required: a prompt fails "
        "when bwrap is missing) or none (plain subprocesses, no warning). In the sandbox the system is "
        "read-only, only the prompt's folder and its own /tmp are writable, it has its own pid namespace "
        "and sees no home folder, run folder, other prompt or Docker socket.",
    )

    sandbox_network: Literal["outbound", "none", "host"] = Field(
        default="outbound",
        validation_alias=AliasChoices("HERMES_SANDBOX_NETWORK"),
        description="Local backend under bubblewrap: outbound (default; true means the same): the internet "
        "only, through a network namespace of the prompt's own behind slirp4netns, with no way to this "
        "machine's loopback services, its own addresses, link-local/metadata or private ranges (except "
        "HERMES_SANDBOX_ALLOW_NETWORKS); none (false): only a private loopback; host: the host's network "
        "as it is, loopback services included (unsafe: a command can drive a local Prefect API).",
    )

    sandbox_agent: Literal["auto", "native", "python"] = Field(
        default="auto",
        validation_alias=AliasChoices("HERMES_SANDBOX_AGENT"),
        description="Local backend under bubblewrap: the agent inside each sandbox that runs its commands "
        "and opens its files. auto (default): the native one (sandbox_agent.c, built once per machine with "
        "the C compiler into ~/.cache/hermes-batch) when it can be built, else the Python one, with one log "
        "line; native: required (a sandbox fails to start without it); python: always the Python one. Both "
        "behave the same; the native one starts with about 14 ms less CPU per prompt.",
    )

    sandbox_allow_networks: CommaList = Field(
        default_factory=list,
        validation_alias=AliasChoices("HERMES_SANDBOX_ALLOW_NETWORKS"),
        description="Comma-separated IPv4 networks (CIDR, e.g. 10.20.0.0/16) that outbound sandboxes may "
        "reach although they are private, link-local or this machine's own addresses.",
    )

    cwd_roots: CommaList = Field(
        default_factory=list,
        validation_alias=AliasChoices("HERMES_CWD_ROOTS"),
        description="Comma-separated host folders under which a dataset record's absolute cwd may lie "
        "(local backend: it is copied into the prompt's folder, never mounted); default: the dataset "
        "file's own folder.",
    )

    cwd_copy_max_mb: int = Field(
        default=512,
        ge=1,
        validation_alias=AliasChoices("HERMES_CWD_COPY_MAX_MB"),
        description="Largest absolute cwd (MB of files) the local backend copies into a prompt's folder.",
    )

    sandbox_env: CommaList = Field(
        default_factory=list,
        validation_alias=AliasChoices("HERMES_SANDBOX_ENV"),
        description="Comma-separated names of host environment variables passed into every sandbox "
        "(local, docker, singularity, modal), values taken from this process's environment; nothing "
        "else of the host's environment gets in (local commands also get PATH, HOME, LANG/LC_*, TERM, "
        "TZ, TMPDIR, USER, SHELL).",
    )

    modal_app_name: str = Field(
        default="hermes-batch",
        validation_alias=AliasChoices("HERMES_MODAL_APP"),
        description="Modal app that owns the sandboxes of the modal backend (created if missing).",
    )

    @field_validator("sandbox_network", mode="before")
    @classmethod
    def _network_mode(cls, value: Any) -> Any:
        """true/false (the earlier boolean setting) mean outbound/none."""
        if isinstance(value, bool):
            return "outbound" if value else "none"
        if isinstance(value, str) and value.strip().lower() in _BOOLEAN_WORDS:
            return _BOOLEAN_WORDS[value.strip().lower()]
        return value

    @field_validator("sandbox_allow_networks")
    @classmethod
    def _networks(cls, networks: list[str]) -> list[str]:
        import ipaddress

        for network in networks:
            try:
                ipaddress.IPv4Network(network, strict=False)
            except ValueError:
                raise ValueError(
                    f"HERMES_SANDBOX_ALLOW_NETWORKS must be a comma-separated list of IPv4 networks "
                    f"(e.g. 10.20.0.0/16); not valid: {network!r}"
                ) from None
        return networks

    @field_validator("sandbox_env")
    @classmethod
    def _variable_names(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not _ENV_NAME.fullmatch(name)]
        if bad:
            raise ValueError(
                f"HERMES_SANDBOX_ENV must be a comma-separated list of environment variable names "
                f"(letters, digits, _; not starting with a digit); not valid: {', '.join(map(repr, bad))}"
            )
        return names


class LimitSettings(_Area):
    """Bounds of what goes back to the model."""

    terminal_output_max_chars: int = Field(
        default=50_000,
        ge=1000,
        validation_alias=AliasChoices("HERMES_TERMINAL_OUTPUT_MAX_CHARS"),
        description="Bound of a terminal result's output; longer output keeps the first 40% and last 60%.",
    )

    tool_result_max_chars: int = Field(
        default=100_000,
        ge=1000,
        validation_alias=AliasChoices("HERMES_TOOL_RESULT_MAX_CHARS"),
        description="Bound of any tool result (file tools included), characters.",
    )


class WebSettings(_Area):
    """The web toolset (web_search, web_extract): the first configured backend, or web_backend."""

    web_backend: Literal["auto", "firecrawl", "tavily", "searxng"] = Field(
        default="auto",
        validation_alias=AliasChoices("HERMES_WEB_BACKEND"),
        description="Web backend: auto = the first configured of Firecrawl, Tavily, SearXNG.",
    )

    firecrawl_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("FIRECRAWL_API_KEY"),
        description="Firecrawl API key (search and extraction).",
    )

    firecrawl_api_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("FIRECRAWL_API_URL"),
        description="Self-hosted Firecrawl base URL (no key needed); None = https://api.firecrawl.dev.",
    )

    tavily_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("TAVILY_API_KEY"),
        description="Tavily API key (search and extraction).",
    )

    tavily_api_url: str = Field(
        default="https://api.tavily.com",
        validation_alias=AliasChoices("TAVILY_API_URL"),
        description="Tavily base URL.",
    )

    searxng_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("SEARXNG_URL"),
        description="Self-hosted SearXNG base URL (JSON format enabled); search only, pages are fetched directly.",
    )

    web_timeout: float = Field(
        default=30.0,
        gt=0,
        validation_alias=AliasChoices("HERMES_WEB_TIMEOUT"),
        description="Timeout of one web request (vendor API, page or image download), seconds.",
    )

    web_max_retries: int = Field(
        default=2,
        ge=0,
        validation_alias=AliasChoices("HERMES_WEB_MAX_RETRIES"),
        description="Retries of a web/image vendor request on 429, 5xx, timeouts and connection errors.",
    )

    web_max_bytes: int = Field(
        default=5_000_000,
        ge=10_000,
        validation_alias=AliasChoices("HERMES_WEB_MAX_BYTES"),
        description="Largest page or vendor response read, bytes; a larger one is an error.",
    )

    web_block_private_addresses: bool = Field(
        default=True,
        validation_alias=AliasChoices("HERMES_WEB_BLOCK_PRIVATE_ADDRESSES"),
        description=(
            "web_extract and image downloads refuse loopback, private, link-local and reserved addresses "
            "(set false to reach pages on this machine, e.g. offline demos)."
        ),
    )


class ImageSettings(_Area):
    """The image_gen toolset (image_generate)."""

    image_backend: Literal["auto", "fal", "openai"] = Field(
        default="auto",
        validation_alias=AliasChoices("HERMES_IMAGE_BACKEND"),
        description="Image backend: auto = FAL when FAL_KEY is set, else the OpenAI-compatible image_base_url.",
    )

    fal_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("FAL_KEY"),
        description="FAL.ai API key.",
    )

    fal_model: str = Field(
        default="fal-ai/flux-2/klein/9b",
        validation_alias=AliasChoices("HERMES_FAL_MODEL"),
        description="FAL model id (endpoint path).",
    )

    fal_api_url: str = Field(
        default="https://fal.run",
        validation_alias=AliasChoices("HERMES_FAL_API_URL"),
        description="FAL synchronous run base URL.",
    )

    image_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_IMAGE_BASE_URL"),
        description="OpenAI-compatible endpoint (…/v1) serving POST /images/generations.",
    )

    image_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_IMAGE_API_KEY"),
        description="Key of image_base_url; None = the model API key.",
    )

    image_model: str = Field(
        default="gpt-image-1",
        validation_alias=AliasChoices("HERMES_IMAGE_MODEL"),
        description="Model id sent to the OpenAI-compatible images endpoint.",
    )

    image_timeout: float = Field(
        default=180.0,
        gt=0,
        validation_alias=AliasChoices("HERMES_IMAGE_TIMEOUT"),
        description="Timeout of one image generation request, seconds.",
    )


class VisionSettings(_Area):
    """The vision toolset (vision_analyze, browser_vision): an OpenAI-compatible chat model with image input."""

    vision_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_VISION_MODEL", "AUXILIARY_VISION_MODEL"),
        description="Vision model id; None = the run's own model.",
    )

    vision_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_VISION_BASE_URL"),
        description="Endpoint of the vision model; None = the run's endpoint (with the run's key).",
    )

    vision_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_VISION_API_KEY"),
        description="Key of vision_base_url; None = the model API key.",
    )

    vision_timeout: float = Field(
        default=120.0,
        gt=0,
        validation_alias=AliasChoices("HERMES_VISION_TIMEOUT"),
        description="Timeout of one vision request, seconds.",
    )

    vision_max_image_bytes: int = Field(
        default=20_000_000,
        ge=10_000,
        validation_alias=AliasChoices("HERMES_VISION_MAX_IMAGE_BYTES"),
        description="Largest image sent to the vision model, bytes.",
    )


class MoaSettings(_Area):
    """The moa toolset (mixture_of_agents)."""

    moa_reference_models: CommaList = Field(
        default_factory=list,
        validation_alias=AliasChoices("HERMES_MOA_REFERENCE_MODELS"),
        description="Reference model ids, comma-separated; empty = the run's own model.",
    )

    moa_aggregator_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_MOA_AGGREGATOR_MODEL"),
        description="Aggregator model id; None = the run's own model.",
    )

    moa_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_MOA_BASE_URL"),
        description="Endpoint of the MoA models; None = the run's endpoint (with the run's key).",
    )

    moa_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_MOA_API_KEY"),
        description="Key of moa_base_url; None = the model API key.",
    )

    moa_timeout: float = Field(
        default=300.0,
        gt=0,
        validation_alias=AliasChoices("HERMES_MOA_TIMEOUT"),
        description="Timeout of one MoA model request, seconds.",
    )


class BrowserSettings(_Area):
    """The browser toolset (browser_*): Playwright driving a local Chromium."""

    browser_executable_path: str | None = Field(
        default=None,
        validation_alias=AliasChoices("HERMES_BROWSER_EXECUTABLE_PATH"),
        description="Chromium executable; None = /usr/bin/chromium if present, else chromium on PATH.",
    )

    browser_headless: bool = Field(
        default=True,
        validation_alias=AliasChoices("HERMES_BROWSER_HEADLESS"),
        description="Run Chromium headless.",
    )

    browser_max_contexts: int = Field(
        default=8,
        ge=1,
        validation_alias=AliasChoices("HERMES_BROWSER_MAX_CONTEXTS"),
        description="Browser contexts (one per prompt using the browser) open at once in this process.",
    )

    browser_timeout: float = Field(
        default=30.0,
        gt=0,
        validation_alias=AliasChoices("HERMES_BROWSER_TIMEOUT"),
        description="Timeout of one browser command, seconds (navigation gets twice this).",
    )


class HermesSettings(
    ModelEndpointSettings,
    SandboxSettings,
    LimitSettings,
    WebSettings,
    ImageSettings,
    VisionSettings,
    MoaSettings,
    BrowserSettings,
):
    """Process-wide settings: every area in one object. Build with keyword arguments to override the environment.

    Each area is its own model above (a component may take just the area it uses); this class
    is their union, so ``settings.terminal_timeout`` and ``settings.web_timeout`` both work.

    Examples:
        >>> HermesSettings(terminal_timeout=30).terminal_timeout
        30
    """


__all__ = [
    "BrowserSettings",
    "HermesSettings",
    "ImageSettings",
    "LimitSettings",
    "ModelEndpointSettings",
    "MoaSettings",
    "SandboxSettings",
    "TerminalBackend",
    "VisionSettings",
    "WebSettings",
]
