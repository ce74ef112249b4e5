"""The parameters of a run: one pydantic model built by the command line and by Prefect deployments.

Field names and defaults are the reference ``batch_runner.py`` flags (SPEC
section 3); the rest are ours. No secret is a field: the API key comes from the
environment (``OPENROUTER_API_KEY`` / ``OPENAI_API_KEY``) or from a Prefect
Secret block named by ``api_key_secret``.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import date
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from hermes_core.agent import AgentConfig
from hermes_core.client import ModelOptions, ProviderSort, ReasoningEffort
from hermes_core.distributions import DISTRIBUTIONS
from hermes_core.runner import RunSpec

DEFAULT_MODEL = "anthropic/claude-sonnet-4.6"
_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class BatchConfig(BaseModel):
    """Every flag of a run. Validation errors name the field."""

    model_config = ConfigDict(extra="forbid")

    dataset_file: str = Field(description='JSONL dataset path (one {"prompt": ...} object per line).')
    batch_size: int = Field(ge=1, description="Prompts per batch file / checkpoint unit.")
    run_name: str = Field(
        description="Output folder data/<run_name>/ ({date} is replaced by the scheduled date)."
    )
    distribution: str = Field(default="default", description="Toolset distribution to sample from.")
    model: str = Field(
        default=DEFAULT_MODEL, description="Model id; mock/... uses the built-in offline model."
    )
    base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint; default https://openrouter.ai/api/v1 (built-in server for mock/).",
    )
    max_turns: int = Field(default=10, ge=1, description="Most model calls per prompt.")
    num_workers: int = Field(default=4, ge=1, le=1024, description="Prompts in flight at once.")
    resume: bool = Field(default=False, description="Continue an existing run.")
    verbose: bool = Field(default=False, description="Detailed logs.")
    max_samples: int | None = Field(default=None, ge=1, description="Only the first N valid records.")
    max_tokens: int | None = Field(
        default=None, ge=1, description="Token limit per response (model default)."
    )
    providers_allowed: list[str] | None = Field(default=None, description="OpenRouter provider.only.")
    providers_ignored: list[str] | None = Field(default=None, description="OpenRouter provider.ignore.")
    providers_order: list[str] | None = Field(default=None, description="OpenRouter provider.order.")
    provider_sort: ProviderSort | None = Field(default=None, description="price, throughput or latency.")
    reasoning_effort: ReasoningEffort | None = Field(default=None, description="none ... xhigh.")
    reasoning_disabled: bool = Field(
        default=False, description="Disable reasoning tokens (wins over effort)."
    )
    ephemeral_system_prompt: str | None = Field(
        default=None, description="System prompt sent but never stored."
    )
    log_prefix_chars: int = Field(
        default=100, ge=0, description="Preview length of tool calls/results in logs."
    )
    prefill_messages_file: str | None = Field(
        default=None,
        description="JSON array of {role, content} few-shot messages sent after the system prompt.",
    )
    # ours
    prompt_timeout: float | None = Field(default=None, gt=0, description="Wall-clock seconds per prompt.")
    retry_timeouts: bool = Field(
        default=False,
        description="Retry (as a transient failure) a prompt that ran past --prompt_timeout; it pays again.",
    )
    overwrite: bool = Field(default=False, description="Delete an existing run's outputs and start again.")
    skip_invalid: bool = Field(default=False, description="Skip invalid dataset lines with a warning.")
    terminal_env: Literal["local", "docker", "singularity", "modal"] | None = Field(
        default=None, description="Sandbox backend (default: TERMINAL_ENV, else local)."
    )
    seed: int = Field(default=0, description="Seed of the per-prompt toolset draw.")
    output_dir: str = Field(default="data", description="Parent folder of run folders.")
    retries: int = Field(
        default=1, ge=0, le=10, description="Prefect task retries of a prompt after a transient failure."
    )
    api_key_secret: str | None = Field(
        default=None,
        description="Name of a Prefect Secret block holding the API key (instead of the environment).",
    )
    task_runner: Literal["threads", "dask"] = Field(
        default="threads",
        description="Where prompt tasks run: the flow's thread pool, or Dask (prefect-dask).",
    )
    dask_address: str | None = Field(
        default=None,
        description="Address of a running Dask scheduler (tcp://host:8786); none = a local cluster.",
    )
    dask_workers: int = Field(default=2, ge=1, le=256, description="Processes of the local Dask cluster.")
    result_storage: str | None = Field(
        default=None,
        description="Task result cache: a folder (default data/<run_name>/.prefect-results) or block:<storage block slug>.",
    )

    _prefill: list[dict[str, str]] = PrivateAttr(default_factory=list)

    @field_validator("providers_allowed", "providers_ignored", "providers_order", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list | tuple):
            items = [part.strip() for item in value for part in str(item).split(",")]
            return [item for item in items if item] or None
        return value

    @field_validator("distribution")
    @classmethod
    def _known_distribution(cls, value: str) -> str:
        if value not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {value!r}; available: {', '.join(sorted(DISTRIBUTIONS))}")
        return value

    @field_validator("run_name")
    @classmethod
    def _safe_run_name(cls, value: str) -> str:
        if not _RUN_NAME_RE.match(value.replace("{date}", "0")) or ".." in value:
            raise ValueError(
                f"run_name {value!r} must be letters, digits, '.', '_' or '-' (no '/'); {{date}} is allowed"
            )
        return value

    @model_validator(mode="after")
    def _load_prefill(self) -> BatchConfig:
        self._prefill = load_prefill(self.prefill_messages_file) if self.prefill_messages_file else []
        return self

    def for_date(self, day: date) -> BatchConfig:
        """This config with ``{date}`` in ``run_name`` replaced by ``day`` (YYYY-MM-DD).

        A nightly deployment names its run ``nightly-{date}``: each scheduled night writes
        its own run folder, and a retry of that night continues the same one.
        """
        if "{date}" not in self.run_name:
            return self
        return self.model_copy(update={"run_name": self.run_name.replace("{date}", day.isoformat())})

    @property
    def run_dir(self) -> Path:
        """``<output_dir>/<run_name>``."""
        return Path(self.output_dir) / self.run_name

    @property
    def prefill_messages(self) -> list[dict[str, str]]:
        """The validated prefill messages (empty when no file)."""
        return self._prefill

    def run_spec(self) -> RunSpec:
        """The hermes_core view of this run."""
        return RunSpec(
            run_name=self.run_name,
            distribution=self.distribution,
            seed=self.seed,
            model=ModelOptions(
                model=self.model,
                max_tokens=self.max_tokens,
                providers_allowed=self.providers_allowed,
                providers_ignored=self.providers_ignored,
                providers_order=self.providers_order,
                provider_sort=self.provider_sort,
                reasoning_effort=self.reasoning_effort,
                reasoning_disabled=self.reasoning_disabled,
            ),
            agent=AgentConfig(
                max_turns=self.max_turns,
                ephemeral_system_prompt=self.ephemeral_system_prompt,
                prefill_messages=self.prefill_messages,
                log_prefix_chars=self.log_prefix_chars,
            ),
            base_url=self.base_url,
            prompt_timeout=self.prompt_timeout,
            terminal_env=self.terminal_env,
        )

    def defining_settings(self) -> dict[str, Any]:
        """The settings that define a sample (SPEC section 9); a run refuses to change them."""
        return {
            "model": self.model,
            "distribution": self.distribution,
            "max_turns": self.max_turns,
            "max_tokens": self.max_tokens,
            "reasoning_effort": self.reasoning_effort,
            "reasoning_disabled": self.reasoning_disabled,
            "ephemeral_system_prompt": self.ephemeral_system_prompt,
            "prefill_messages": self.prefill_messages,
            "seed": self.seed,
        }

    def settings_hash(self) -> str:
        """sha256 (hex, 16 chars) of :meth:`defining_settings`."""
        blob = json.dumps(self.defining_settings(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_prefill(path: str) -> list[dict[str, str]]:
    """Read a prefill file: a JSON array of ``{"role", "content"}`` objects.

    Raises:
        ValueError: the file is missing, not JSON, or an item is malformed (message names the file and item).
    """
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"prefill_messages_file {path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"prefill_messages_file {path}: not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    if not isinstance(data, list):
        raise ValueError(f"prefill_messages_file {path}: expected a JSON array of {{role, content}} objects")
    for i, item in enumerate(data):
        if (
            not isinstance(item, dict)
            or item.get("role") not in {"system", "user", "assistant"}
            or not isinstance(item.get("content"), str)
        ):
            raise ValueError(
                f'prefill_messages_file {path}: item {i} must be {{"role": system|user|assistant, "content": str}}'
            )
    return [{"role": item["role"], "content": item["content"]} for item in data]
