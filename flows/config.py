"""The options of a run: one pydantic model, the single declaration behind the flags and the flow's parameters.

:class:`BatchConfig` holds the run's own options and nests the hermes_core models it
configures (:class:`~hermes_core.client.ModelOptions` as ``llm``, :class:`~hermes_core.agent.AgentConfig`
as ``agent``) instead of re-declaring their fields. Their fields are flat options too:
:func:`run_options` lists every option (name -> pydantic field) in declaration order, and both
the command line (``flows.cli``) and the ``generate-trajectories`` flow's parameters
(``flows.generate``) are generated from it. Adding an option is one field plus its use.

Field names and defaults are the reference ``batch_runner.py`` flags (README § Command line); the
rest are ours. No secret is an option: the API key comes from the environment
(``OPENROUTER_API_KEY`` / ``OPENAI_API_KEY``), ``--api_key`` (kept in memory) or a Prefect
Secret block named by ``api_key_secret``.

Descriptions are plain text: the Prefect UI renders them as markdown/HTML, so they use no angle
brackets (``<run_name>`` would vanish) and name other options, not ``--flags``. An option typed
``Literal[...] | None`` is a dropdown in the UI whose first value, :data:`UNSET_CHOICE`, stands for
None (see :func:`options_signature`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import types
import typing
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from hermes_core.agent import AgentConfig
from hermes_core.client import ModelOptions
from hermes_core.compression.algorithm import DEFAULT_TARGET_MAX_TOKENS, CompressionSettings
from hermes_core.compression.tokens import DEFAULT_TOKENIZER
from hermes_core.distributions import DISTRIBUTIONS
from hermes_core.options import DEFINING, is_defining, is_run_option
from hermes_core.runner import JudgeSpec, RunSpec
from hermes_core.scoring import DEFAULT_VERIFY_TIMEOUT, KEEP_CHOICES, check_scorers
from hermes_core.settings import TerminalBackend

_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

DistributionName = Literal[tuple(sorted(DISTRIBUTIONS))]  # type: ignore[valid-type]
"""The toolset distributions, as choices (``--list_distributions`` describes them)."""
TaskRunnerName = Literal["threads", "dask"]
"""Where prompt tasks run: ``threads`` (the flow's thread pool) or ``dask`` (prefect-dask)."""
BudgetAction = Literal["drain", "cancel"]
KeepChoice = Literal[KEEP_CHOICES]  # type: ignore[valid-type]
"""What a reached spend cap does to running prompts: ``drain`` (they finish) or ``cancel``."""
UNSET_CHOICE = "default"
"""The flow-parameter value of an unset (None) option that has a fixed set of values.

Prefect's UI shows an ``X | None`` parameter as a type picker, and its schema check refuses
``null`` for a parameter whose schema lists its values; so such an option is, as a flow
parameter, a plain dropdown whose first entry ``default`` means "not set" (None in the config,
the command line's flag left out). :meth:`BatchConfig.from_options` reads it as None.
"""

GROUPS: dict[str, type[BaseModel]] = {"llm": ModelOptions, "agent": AgentConfig}
"""Nested hermes_core models whose fields are flat options of the run."""


class BatchConfig(BaseModel):
    """Every option of a run. Build from flat options with :meth:`from_options`; errors name the option."""

    model_config = ConfigDict(extra="forbid")

    dataset_file: str = Field(description='JSONL dataset path (one {"prompt": ...} object per line).')
    batch_size: int = Field(ge=1, description="Prompts per batch file / checkpoint unit.")
    run_name: str = Field(
        description="Output folder name (letters, digits, dot, underscore, hyphen): the run writes to "
        "output_dir/run_name/; {date} is replaced by the scheduled date (YYYY-MM-DD)."
    )
    distribution: DistributionName = Field(
        default="default", description="Toolset distribution to sample from.", json_schema_extra=DEFINING
    )
    llm: ModelOptions = Field(default_factory=ModelOptions, description="Model request options.")
    base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint; default HERMES_BASE_URL, else https://openrouter.ai/api/v1 "
        "(the built-in server for mock/ models).",
    )
    agent: AgentConfig = Field(default_factory=AgentConfig, description="Agent loop options.")
    num_workers: int = Field(default=4, ge=1, le=1024, description="Prompts in flight at once.")
    resume: bool = Field(default=False, description="Continue an existing run.")
    verbose: bool = Field(default=False, description="Detailed logs (Prefect's per-task lines, tool calls).")
    max_samples: int | None = Field(default=None, ge=1, description="Only the first N valid records.")
    prefill_messages_file: str | None = Field(
        default=None,
        description="JSON array of {role, content} few-shot messages sent after the system prompt, never stored.",
    )
    # ours
    prompt_timeout: float | None = Field(
        default=None, gt=0, description="Wall-clock seconds per prompt, retries included."
    )
    retry_timeouts: bool = Field(
        default=False,
        description="Retry (as a transient failure) a prompt that ran past prompt_timeout; it pays again.",
    )
    overwrite: bool = Field(default=False, description="Delete an existing run's outputs and start again.")
    skip_invalid: bool = Field(default=False, description="Skip invalid dataset lines with a warning.")
    terminal_env: TerminalBackend | None = Field(
        default=None, description="Sandbox backend (default: TERMINAL_ENV, else local)."
    )
    seed: int = Field(
        default=0, description="Seed of the per-prompt toolset draw.", json_schema_extra=DEFINING
    )
    output_dir: str = Field(default="data", description="Parent folder of run folders.")
    retries: int = Field(
        default=1, ge=0, le=10, description="Prefect task retries of a prompt after a transient failure."
    )
    scorer: str = Field(
        default="auto",
        description="Scorers of each trajectory, a comma list: auto (verify when the record has a verify "
        "command, else answer when it has an answer), answer (the final answer against the record's "
        "answer), verify (the record's verify command in the prompt's sandbox; exit 0 passes), judge (an "
        "LLM judge: judge_model, judge_base_url, judge_rubric_file), python:module:function (your "
        "function(row, record) returning {value, passed, explanation}).",
    )
    verify_timeout: float = Field(
        default=DEFAULT_VERIFY_TIMEOUT, gt=0, description="Seconds a record's verify command may run."
    )
    judge_model: str | None = Field(
        default=None,
        description="Model of the judge scorer (default: the run's model).",
    )
    judge_base_url: str | None = Field(
        default=None, description="Endpoint of the judge scorer (default: the run's endpoint)."
    )
    judge_rubric_file: str | None = Field(
        default=None,
        description="Text file with the judge's rubric (default: a built-in one that compares the final "
        "answer with the record's answer, or judges the task's completion when it has none).",
    )
    stop_when_passed: bool = Field(
        default=False,
        description="Once a sample of a record passes, its samples that have not started do not start "
        "(the saving is reported).",
    )
    samples_per_prompt: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Samples drawn for each record (each its own prompt task, cached and retried alone; "
        "the samples of a record get the same tools). A resume with more adds samples.",
    )
    keep: KeepChoice = Field(
        default="all",
        description="Rows trajectories.jsonl keeps: all; passed (metadata.passed true); best (per record, "
        "the highest mean score, ties to the fewest model calls). The others go to rejected.jsonl.",
    )
    compress_to_tokens: int | None = Field(
        default=None,
        ge=64,
        description="After the merge, compress each row over this many tokens (the tokenizer's) to it: a middle "
        "region of turns becomes one summary turn (trajectories_compressed.jsonl, compression_metrics.json).",
    )
    tokenizer: str = Field(
        default=DEFAULT_TOKENIZER,
        min_length=1,
        description="Tokenizer that counts a row's tokens for compress_to_tokens: a tokenizer.json file or a "
        "Hugging Face Hub id (default: the reference's, fetched from the Hub once; offline, give a file).",
    )
    summary_model: str | None = Field(
        default=None, description="Model that writes the summaries of compression (default: the run's model)."
    )
    summary_base_url: str | None = Field(
        default=None, description="Endpoint of summary_model (default: the run's endpoint)."
    )
    summary_target_tokens: int = Field(
        default=750, ge=16, le=8192, description="Length a summary is asked to have, tokens."
    )
    protect_last_n_turns: int = Field(
        default=4, ge=0, le=1000, description="Turns at the end of a row that compression never replaces."
    )
    summary_notice: bool = Field(
        default=True,
        description="A compressed row's system turn gains one sentence saying earlier tool output may be summarised.",
    )
    drop_over_limit: bool = Field(
        default=False,
        description="Leave out of trajectories_compressed.jsonl the rows still over compress_to_tokens after "
        "compression (they are kept and counted otherwise).",
    )
    api_key_secret: str | None = Field(
        default=None,
        description="Name of a Prefect Secret block holding the API key (instead of the environment).",
    )
    task_runner: TaskRunnerName = Field(
        default="threads",
        description="Where prompt tasks run: the flow's thread pool, or Dask (prefect-dask).",
    )
    dask_address: str | None = Field(
        default=None,
        description="Address of a running Dask scheduler (tcp://host:8786); unset: a local cluster.",
    )
    dask_workers: int = Field(default=2, ge=1, le=256, description="Processes of the local Dask cluster.")
    result_storage: str | None = Field(
        default=None,
        description="Task result cache: a folder (default: .prefect-results in the run folder) or "
        "block:SLUG, a saved Prefect storage block (e.g. block:s3-bucket/hermes-cache).",
    )
    # run control (README § Run control; flows.budget, flows.pilot, hermes_core.limiter)
    max_cost_usd: float | None = Field(
        default=None,
        gt=0,
        description="Spend cap of the whole run in USD (every invocation); needs a cost source: the "
        "provider's usage.cost (OpenRouter) or price_per_mtok_in and price_per_mtok_out.",
    )
    max_total_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Cap of the whole run's prompt + completion tokens (every invocation).",
    )
    price_per_mtok_in: float | None = Field(
        default=None, ge=0, description="USD per million prompt tokens, for requests that report no cost."
    )
    price_per_mtok_out: float | None = Field(
        default=None, ge=0, description="USD per million completion tokens, for requests that report no cost."
    )
    on_budget: BudgetAction = Field(
        default="drain",
        description="When the cap is reached: drain (running prompts finish) or cancel them; no new prompt starts.",
    )
    adaptive_concurrency: bool = Field(
        default=True,
        description="One run-wide limit on model requests in flight, halved on 429/503 and grown back to num_workers.",
    )
    concurrency_limit: str | None = Field(
        default=None,
        min_length=1,
        description="Name of a Prefect global concurrency limit: every prompt of every flow run that names it "
        "holds one of its slots while it runs (on any worker or machine of the same Prefect server), so runs "
        "sharing a provider key stay within its quota together. Slots are leased: a killed run's come back "
        "when their lease ends.",
    )
    concurrency_limit_slots: int | None = Field(
        default=None,
        ge=1,
        description="Slots of concurrency_limit, used only to create it when it does not exist (an existing "
        "limit is left as it is: change it with prefect gcl update).",
    )
    concurrency_lease_seconds: float = Field(
        default=120.0,
        ge=60,
        le=86400,
        description="Lease of a concurrency_limit slot, seconds (renewed while the prompt runs): the slots of "
        "a crashed or killed run are free again after at most this long (plus the server's 15 s pass).",
    )
    pilot: int | None = Field(
        default=None,
        ge=1,
        description="Run only N prompts drawn (seeded) across the dataset and write pilot.json with the "
        "projected tokens, cost and time of the whole dataset.",
    )

    @classmethod
    def from_options(cls, **options: Any) -> BatchConfig:
        """Build from flat options (the flags / flow parameters: ``model=...``, ``max_turns=...``).

        :data:`UNSET_CHOICE` (``"default"``) given for an option of :func:`unset_choice_options`
        means None (not set).

        Raises:
            OptionError: an unknown option, a missing required one, an invalid value, or a cost cap
                with no cost source (:func:`flows.budget.cost_source`); the message names the option.
        """
        unknown = sorted(set(options) - set(run_options()))
        if unknown:
            raise OptionError(unknown[0], "not an option of this flow")
        values: dict[str, Any] = {name: {} for name in GROUPS}
        for name, value in options.items():
            if value == UNSET_CHOICE and name in _UNSET_CHOICES:
                value = None
            group = _GROUP_OF.get(name)
            (values[group] if group else values)[name] = value
        try:
            config = cls(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = [str(part) for part in first["loc"] if not isinstance(part, int)]
            name = next(
                (part for part in reversed(loc) if part in run_options()), loc[-1] if loc else "options"
            )
            reason = first["msg"].removeprefix("Value error, ")
            if isinstance(first.get("input"), str | int | float) and first["type"] != "value_error":
                reason += f" (got {first['input']!r})"
            raise OptionError(name, reason) from None
        from flows.budget import cost_source

        if config.max_cost_usd is not None and cost_source(config) is None:
            raise OptionError(
                "max_cost_usd",
                "needs a cost source: this endpoint does not report cost (OpenRouter does, and a mock "
                "model id with cost=...); pass --price_per_mtok_in and --price_per_mtok_out (USD per million tokens)",
            )
        return config

    def options(self) -> dict[str, Any]:
        """The flat options of this config (JSON-able): the flow's parameters.

        An unset option of :func:`unset_choice_options` is :data:`UNSET_CHOICE`, not None, so
        that these are valid parameters of a deployment too (its schema check refuses null there).
        """
        dumped = self.model_dump(mode="json")
        flat = {}
        for name, (group, _field) in _OPTIONS.items():
            flat[name] = dumped[group][name] if group else dumped[name]
            if flat[name] is None and name in _UNSET_CHOICES:
                flat[name] = UNSET_CHOICE
        return flat

    @field_validator("run_name")
    @classmethod
    def _safe_run_name(cls, value: str) -> str:
        if not _RUN_NAME_RE.match(value.replace("{date}", "0")) or ".." in value:
            raise ValueError(
                f"run_name {value!r} must be letters, digits, '.', '_' or '-' (no '/'); {{date}} is allowed"
            )
        return value

    @field_validator("scorer")
    @classmethod
    def _known_scorers(cls, value: str) -> str:
        return ",".join(check_scorers([name.strip() for name in value.split(",") if name.strip()]))

    @field_validator("judge_rubric_file")
    @classmethod
    def _readable_rubric(cls, value: str | None) -> str | None:
        if value:
            load_rubric(value)
        return value

    @field_validator("prefill_messages_file")
    @classmethod
    def _readable_prefill(cls, value: str | None) -> str | None:
        if value:
            load_prefill(value)  # a clear error naming the file and item, at validation time
        return value

    @model_validator(mode="after")
    def _load_prefill(self) -> BatchConfig:
        if self.prefill_messages_file and not self.agent.prefill_messages:
            self.agent = self.agent.model_copy(
                update={"prefill_messages": load_prefill(self.prefill_messages_file)}
            )
        return self

    @property
    def model(self) -> str:
        """The model id."""
        return self.llm.model

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
        return self.agent.prefill_messages

    def run_spec(self) -> RunSpec:
        """The hermes_core view of this run."""
        return RunSpec(
            run_name=self.run_name,
            distribution=self.distribution,
            seed=self.seed,
            model=self.llm,
            agent=self.agent,
            base_url=self.base_url,
            prompt_timeout=self.prompt_timeout,
            terminal_env=self.terminal_env,
            max_requests_in_flight=self.num_workers,
            adaptive_concurrency=self.adaptive_concurrency,
            scorers=self.scorer.split(","),
            samples_per_prompt=self.samples_per_prompt,
            verify_timeout=self.verify_timeout,
            judge=JudgeSpec(
                model=self.judge_model,
                base_url=self.judge_base_url,
                rubric=load_rubric(self.judge_rubric_file) if self.judge_rubric_file else None,
            ),
        )

    def compression_settings(self) -> CompressionSettings:
        """The settings of the compression step (``compress_to_tokens`` set); the summary model defaults to the run's."""
        return CompressionSettings(
            target_max_tokens=self.compress_to_tokens or DEFAULT_TARGET_MAX_TOKENS,
            protect_last_n_turns=self.protect_last_n_turns,
            summary_target_tokens=self.summary_target_tokens,
            summary_notice=self.summary_notice,
            summary_model=self.summary_model or self.model,
            drop_over_limit=self.drop_over_limit,
        )

    def defining_settings(self) -> dict[str, Any]:
        """The settings that define a sample (README § Resume, retries, identity; fields marked DEFINING); a run refuses to change them."""
        settings: dict[str, Any] = {}
        for model in (self, *(getattr(self, name) for name in GROUPS)):
            for name, info in type(model).model_fields.items():
                if is_defining(info, getattr(model, name)):
                    settings[name] = getattr(model, name)
        return settings

    def settings_hash(self) -> str:
        """sha256 (hex, 16 chars) of :meth:`defining_settings`."""
        blob = json.dumps(self.defining_settings(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class OptionError(ValueError):
    """An invalid run option. Attributes: ``option`` (its flat name), ``reason``."""

    def __init__(self, option: str, reason: str):
        super().__init__(f"invalid {option}: {reason}")
        self.option = option
        self.reason = reason


def _collect_options() -> dict[str, tuple[str | None, FieldInfo]]:
    options: dict[str, tuple[str | None, FieldInfo]] = {}
    for name, info in BatchConfig.model_fields.items():
        group = GROUPS.get(name)
        if group is None:
            options[name] = (None, info)
            continue
        for inner, inner_info in group.model_fields.items():
            if is_run_option(inner_info):
                if inner in options or inner in BatchConfig.model_fields:
                    raise TypeError(f"option {inner!r} of {group.__name__} is declared twice")
                options[inner] = (name, inner_info)
    return options


def _choices(info: FieldInfo) -> tuple[Any, ...]:
    """The values of an option typed ``Literal[...]`` or ``Literal[...] | None``; empty for any other type."""
    annotation = info.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = args[0] if len(args) == 1 else None
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def _collect_unset_choices() -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for name, (_group, info) in _OPTIONS.items():
        values = _choices(info)
        if values and info.default is None:
            if UNSET_CHOICE in values or not all(isinstance(value, str) for value in values):
                raise TypeError(f"option {name!r}: its values must be strings other than {UNSET_CHOICE!r}")
            found[name] = values
    return found


_OPTIONS = _collect_options()
_GROUP_OF = {name: group for name, (group, _) in _OPTIONS.items() if group}
_UNSET_CHOICES = _collect_unset_choices()


def run_options() -> dict[str, FieldInfo]:
    """Every flat option of a run, in declaration order: ``{name: pydantic field}`` (type, default, description)."""
    return {name: info for name, (_, info) in _OPTIONS.items()}


def unset_choice_options() -> dict[str, tuple[str, ...]]:
    """The options with a fixed set of values that may be unset (``Literal[...] | None``, default None).

    Returns:
        ``{name: values}``; as flow parameters their values are :data:`UNSET_CHOICE` then these.
    """
    return dict(_UNSET_CHOICES)


def options_signature() -> inspect.Signature:
    """A keyword-only signature with one parameter per option (annotation and field as the default).

    Prefect reads a flow's parameters from its signature: each field's type, default, bounds and
    choices become the parameter's schema (the UI's custom-run form; descriptions come from
    :func:`options_docstring`), and Prefect validates ``prefect deployment run --param k=v`` values
    against the annotations.

    An option of :func:`unset_choice_options` (``Literal[...] | None``) would be a ``str | None``
    type picker in the form, and its null default would not pass the server's schema check if it
    were a plain dropdown; its parameter is therefore ``{"type": "string", "enum": ["default",
    ...values]}`` with default :data:`UNSET_CHOICE`, and still accepts None from Python callers.
    """
    parameters = []
    for name, info in run_options().items():
        described = Field(description=info.description, json_schema_extra=info.json_schema_extra)
        kind: Any = info.annotation
        extra: tuple[Any, ...] = ()
        default = (
            inspect.Parameter.empty if info.is_required() else info.get_default(call_default_factory=True)
        )
        if name in _UNSET_CHOICES:
            values = (UNSET_CHOICE, *_UNSET_CHOICES[name])
            kind = Literal[values] | None  # type: ignore[valid-type]
            extra = (WithJsonSchema({"type": "string", "enum": list(values)}),)
            default = UNSET_CHOICE
        annotation = Annotated[(kind, *extra, described, *info.metadata)]  # type: ignore[valid-type]
        parameters.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
    return inspect.Signature(parameters, return_annotation=Any)


def parameter_description(name: str) -> str:
    """The description of option ``name`` as a flow parameter (the UI's form): its field's description.

    For an option of :func:`unset_choice_options` whose description does not say what its
    default is, it ends with ``(default: not set)``: the form's dropdown shows that entry.
    """
    description = run_options()[name].description or name
    if name in _UNSET_CHOICES and UNSET_CHOICE not in description:
        description = f"{description.rstrip('.')} ({UNSET_CHOICE}: not set)."
    return description


def options_docstring() -> str:
    """A Google-style ``Args:`` section with each option's description (Prefect's parameter descriptions).

    See :func:`parameter_description`.
    """
    lines = ["", "Args:"]
    for name in run_options():
        lines.append(f"    {name}: {parameter_description(name)}")
    return "\n".join(lines) + "\n"


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


def load_rubric(path: str) -> str:
    """The judge's rubric in text file ``path`` (UTF-8).

    Raises:
        ValueError: the file is missing, unreadable, not UTF-8 or empty (the message names it).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"judge_rubric_file {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"judge_rubric_file {path}: cannot be read ({exc})") from None
    if not text.strip():
        raise ValueError(f"judge_rubric_file {path}: the file is empty")
    return text


__all__ = [
    "GROUPS",
    "BatchConfig",
    "OptionError",
    "load_prefill",
    "options_docstring",
    "options_signature",
    "parameter_description",
    "run_options",
    "unset_choice_options",
    "UNSET_CHOICE",
]
