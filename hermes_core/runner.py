"""One prompt, start to finish (README § Tools): toolsets, sandbox, agent loop, trajectory row.

:func:`run_prompt` is what the Prefect task calls for each dataset record. It
returns a :class:`PromptOutcome` (a trajectory row, or a discard for lack of
reasoning) and raises for a failed prompt; the environment is always torn down.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from hermes_core import spend_guard
from hermes_core.agent import Agent, AgentConfig, AgentResult
from hermes_core.cancel import check_cancelled, check_may_start, tracked
from hermes_core.client import ModelClient, ModelOptions, side_client
from hermes_core.distributions import get_distribution, prompt_rng, sample_toolsets
from hermes_core.endpoints import resolve_backend, resolve_base_url
from hermes_core.environments import create_environment
from hermes_core.exceptions import PromptCancelled
from hermes_core.limiter import ConcurrencyLimiter, run_limiter
from hermes_core.redaction import clean_for_storage, register_secrets_of, scrub_exception
from hermes_core.scoring import (
    DEFAULT_VERIFY_TIMEOUT,
    JUDGE_MAX_TOKENS,
    PYTHON_PREFIX,
    applied_scorers,
    score_answer,
    score_judge,
    score_python,
    score_verify,
)
from hermes_core.settings import HermesSettings
from hermes_core.tools import ALL_POSSIBLE_TOOLS, TOOLSETS, ModelEndpoint, ToolContext, offered_tools
from hermes_core.trajectory import timestamp_now, to_sharegpt, tool_statistics
from hermes_core.usage import Usage


class PromptJob(BaseModel):
    """One sample of a dataset record to run."""

    prompt_index: int = Field(description="0-based position among the valid records.")
    sample_index: int = Field(
        default=0, ge=0, description="Which sample of the record (0 to samples_per_prompt - 1)."
    )
    prompt_id: str = Field(
        description="Identity of the prompt (content, occurrence, defining settings, sample index)."
    )
    record_key: str = Field(
        description="Key of the record alone (content + occurrence), without the run's settings: it seeds "
        "the toolset draw, so runs that differ only in model or turns give a prompt the same tools."
    )
    prompt: str = Field(description="The first user message.")
    image: str | None = Field(default=None, description="Container image of this prompt's sandbox.")
    cwd: str | None = Field(default=None, description="Working directory of this prompt's terminal.")
    source: dict[str, Any] = Field(default_factory=dict, description="Other fields of the record.")

    @property
    def label(self) -> str:
        """How logs and task run names call it: ``"<prompt_index>"``, ``"<prompt_index>.<sample_index>"`` past sample 0."""
        return f"{self.prompt_index}.{self.sample_index}" if self.sample_index else str(self.prompt_index)


class JudgeSpec(BaseModel):
    """The ``judge`` scorer's model, endpoint and rubric (hermes_core.scoring.score_judge)."""

    model: str | None = Field(default=None, description="Judge model; None = the run's model.")
    base_url: str | None = Field(default=None, description="Judge endpoint; None = the run's endpoint.")
    rubric: str | None = Field(default=None, description="Rubric text; None = scoring.JUDGE_RUBRIC.")


class RunSpec(BaseModel):
    """How every prompt of a run is executed (no secret here: the API key comes from settings)."""

    run_name: str = ""
    run_id: str = Field(
        default="", description="Identity of the run folder (run.json): container labels, the task cache key."
    )
    distribution: str = "default"
    seed: int = Field(default=0, description="Seed of the per-prompt toolset draw.")
    model: ModelOptions
    agent: AgentConfig = Field(default_factory=AgentConfig)
    base_url: str | None = Field(
        default=None, description="Endpoint; None = the built-in mock server for mock/ models, else settings."
    )
    prompt_timeout: float | None = Field(default=None, gt=0, description="Wall-clock seconds per prompt.")
    terminal_env: str | None = Field(
        default=None, description="Sandbox backend; None = settings.terminal_env."
    )
    toolsets: list[str] | None = Field(
        default=None, description="Fixed toolsets; None = draw from the distribution."
    )
    max_requests_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="Run-wide limit on model requests in flight in this process (the run's num_workers); "
        "None = no limiter.",
    )
    adaptive_concurrency: bool = Field(
        default=True,
        description="Halve the limit on rate-limit answers and grow it back (hermes_core.limiter).",
    )
    samples_per_prompt: int = Field(
        default=1, ge=1, description="Samples of each record; above 1 the rows carry metadata.sample_index."
    )
    scorers: list[str] = Field(
        default_factory=lambda: ["auto"], description="Scorers to apply (hermes_core.scoring.SCORERS)."
    )
    verify_timeout: float = Field(
        default=DEFAULT_VERIFY_TIMEOUT, gt=0, description="Seconds a record's verify command may run."
    )
    judge: JudgeSpec = Field(default_factory=JudgeSpec, description="The judge scorer's settings.")


class PromptOutcome(BaseModel):
    """A finished prompt: its trajectory row and whether it is kept or discarded for lack of reasoning.

    Results cached by earlier versions say ``completed`` / ``discarded_no_reasoning``: read ``status``
    as "discarded" only when it starts with ``discarded``.
    """

    prompt_id: str
    prompt_index: int
    status: Literal["kept", "discarded"] = Field(
        description="kept: the row goes into the dataset (its own ``completed`` field says whether the turn "
        "limit ended it); discarded: no assistant turn has reasoning (a tombstone is written instead)."
    )
    row: dict[str, Any] = Field(
        description="Trajectory row (README § Outputs); batch_num is set when it is written."
    )
    assistant_turns: int
    turns_with_reasoning: int
    usage: dict[str, Any]
    duration_s: float


def unavailable_tools(distribution: str, settings: HermesSettings) -> dict[str, str]:
    """{tool: reason} for the tools of ``distribution`` that cannot be offered (logged once per run)."""
    toolsets = [ts for ts in get_distribution(distribution).toolsets if ts in TOOLSETS]
    return offered_tools(toolsets, settings)[1]


def run_prompt(
    job: PromptJob,
    spec: RunSpec,
    settings: HermesSettings | None = None,
    *,
    attempt: int = 1,
    limiter: ConcurrencyLimiter | None = None,
) -> PromptOutcome:
    """Run one prompt and build its trajectory row.

    Args:
        job: the record.
        spec: the run's settings.
        settings: process settings (API key, backend defaults); read from the environment when None.
        attempt: 1 for the first try of this prompt, 2 for the first retry ...
        limiter: the run's limiter of model requests in flight, shared by its prompts (the
            prompt's tools' model calls take it too). None: when ``spec.max_requests_in_flight``
            is set, this process's own limiter of the run (:func:`hermes_core.limiter.run_limiter`,
            made on first use: each Dask worker process has its own), else none.

    Raises:
        HermesError: every failure is one (an exception of another library becomes an
            :class:`~hermes_core.exceptions.UnexpectedError`, see
            :func:`hermes_core.redaction.scrub_exception`), its ``usage`` set to what the prompt
            spent (None before its tool context existed). Among them:
        ModelError: provider error after retries, or a non-retryable 4xx.
        PromptTimeout: the prompt ran past ``spec.prompt_timeout``.
        PromptCancelled: the process is stopping (:func:`hermes_core.cancel.cancel_running`), or
            this is a retry (``attempt`` > 1) while it holds new attempts
            (:func:`hermes_core.cancel.hold_new_prompts`).
        SandboxError: the sandbox could not be created or broke.
        ConfigError: unknown distribution or backend, missing API key.
    """
    check_may_start(
        retry=attempt > 1
    )  # a stopping run, or a retry once the budget is spent, starts no sandbox
    settings = settings or HermesSettings()
    register_secrets_of(settings)  # the keys it holds are redacted from every tool result
    started = time.monotonic()
    client = ModelClient(
        spec.model,
        base_url=resolve_base_url(spec.model.model, spec.base_url, settings),
        api_key=settings.api_key,
        timeout=settings.request_timeout,
        max_retries=settings.max_retries,
        limiter=limiter or _process_limiter(spec),
        guard=spend_guard.guard_of(spec.run_id),
    )
    toolsets = spec.toolsets or sample_toolsets(spec.distribution, prompt_rng(spec.seed, job.record_key))
    tools, _ = offered_tools([ts for ts in toolsets if ts in TOOLSETS], settings)
    env = create_environment(
        resolve_backend(spec.terminal_env, settings),
        cwd=job.cwd,
        image=job.image,
        settings=settings,
        run_name=spec.run_name,
        run_id=spec.run_id,
        prompt_id=job.prompt_id,
    )
    deadline = started + spec.prompt_timeout if spec.prompt_timeout else None
    spent: Usage | None = None  # the prompt's usage so far, once its tool context exists
    try:
        with tracked(env), env:  # registered before it starts: a cancel during start still removes it
            endpoint = ModelEndpoint(
                base_url=client.base_url,
                api_key=settings.api_key,
                model=spec.model.model,
                limiter=client.limiter,
                guard=client.guard,
            )
            ctx = ToolContext(env=env, settings=settings, deadline=deadline, model_endpoint=endpoint)
            spent = ctx.usage
            try:
                result = Agent(client, tools, ctx, spec.agent).run(job.prompt)
                scorers = applied_scorers(spec.scorers, job.source)
                scores: dict[str, dict[str, Any]] = {}
                if "verify" in scorers:  # in the agent's sandbox, before it is torn down
                    _check_cancelled(ctx.usage)
                    scores["verify"] = score_verify(env, job.source["verify"], spec.verify_timeout)
                if "judge" in scorers:  # its usage is the prompt's: a failure here carries it too
                    judged, judge_usage = score_judge(
                        _judge_client(spec, client, settings),
                        job.prompt,
                        result.final_response,
                        job.source.get("answer"),
                        spec.judge.rubric,
                        deadline=deadline,
                    )
                    ctx.add_usage(judge_usage)
                    scores["judge"] = judged
            finally:
                ctx.close()
    except Exception as exc:
        failure = scrub_exception(exc)
        failure.usage = None if spent is None else spent.copy()
        _check_cancelled(failure.usage)  # an error caused by a cancellation is one
        if failure is exc:
            raise
        raise failure from None  # no attribute or chain of a foreign exception travels on
    _check_cancelled(result.usage)  # commands killed by a cancellation make no trajectory
    assistant_turns, with_reasoning = result.reasoning
    usage = result.usage.as_dict()
    duration = round(time.monotonic() - started, 3)
    common = {
        "prompt_id": job.prompt_id,
        "prompt_index": job.prompt_index,
        "assistant_turns": assistant_turns,
        "turns_with_reasoning": with_reasoning,
        "usage": usage,
        "duration_s": duration,
    }
    # valid UTF-8 and redacted before it leaves: this row is what the task cache stores
    if "answer" in scorers:
        scores["answer"] = score_answer(result.final_response, job.source["answer"])
    row = build_row(job, spec, result, toolsets, attempt=attempt, duration_s=duration)
    record = {"prompt": job.prompt, **job.source}
    for name in scorers:
        if name.startswith(PYTHON_PREFIX):
            scores[name] = score_python(name, row, record)
    scores = {name: scores[name] for name in scorers}  # in the order --scorer names them
    if scores:
        row["metadata"]["score"] = scores
        row["metadata"]["passed"] = all(score["passed"] for score in scores.values())
    row = clean_for_storage(row)
    status = "kept" if with_reasoning else "discarded"
    return PromptOutcome(status=status, row=row, **common)


def _judge_client(spec: RunSpec, client: ModelClient, settings: HermesSettings) -> ModelClient:
    """The judge's client: the run's limiter, spend cap, key and retries; the judge's model and endpoint."""
    return side_client(
        spec.judge.model or spec.model.model,
        spec.judge.base_url or spec.base_url,
        settings,
        max_tokens=JUDGE_MAX_TOKENS,
        temperature=0.0,
        limiter=client.limiter,
        guard=client.guard,
    )


def _process_limiter(spec: RunSpec) -> ConcurrencyLimiter | None:
    """This process's limiter of the run (made on first use), or None when ``spec`` sets no limit."""
    if not spec.max_requests_in_flight:
        return None
    return run_limiter(
        spec.run_id or spec.run_name, spec.max_requests_in_flight, adaptive=spec.adaptive_concurrency
    )


def _check_cancelled(usage: Usage | None) -> None:
    """Raise PromptCancelled carrying ``usage`` (what the prompt spent) when the run is cancelled."""
    try:
        check_cancelled()
    except PromptCancelled as exc:
        exc.usage = None if usage is None else usage.copy()
        raise


def build_row(
    job: PromptJob,
    spec: RunSpec,
    result: AgentResult,
    toolsets: list[str],
    *,
    attempt: int,
    duration_s: float,
) -> dict[str, Any]:
    """The trajectory row of README § Outputs, keys in order; ``metadata.batch_num`` is set by the ledger."""
    tool_stats, tool_error_counts = tool_statistics(result.messages, ALL_POSSIBLE_TOOLS)
    assistant_turns, with_reasoning = result.reasoning
    return {
        "prompt_index": job.prompt_index,
        "conversations": to_sharegpt(result.messages, result.tools),
        "metadata": {
            "batch_num": None,
            "timestamp": timestamp_now(),
            "model": spec.model.model,
            "prompt_id": job.prompt_id,
            **({"sample_index": job.sample_index} if spec.samples_per_prompt > 1 else {}),
            "usage": result.usage.as_dict(),
            "reasoning": {"assistant_turns": assistant_turns, "turns_with_reasoning": with_reasoning},
            "duration_s": duration_s,
            "attempt": attempt,
            "stop_reason": result.stop_reason,
            "source": job.source,
        },
        "completed": result.completed,
        "partial": result.partial,
        "api_calls": result.api_calls,
        "toolsets_used": toolsets,
        "tool_stats": tool_stats,
        "tool_error_counts": tool_error_counts,
    }


__all__ = [
    "JudgeSpec",
    "PromptJob",
    "PromptOutcome",
    "RunSpec",
    "build_row",
    "run_prompt",
    "unavailable_tools",
]
