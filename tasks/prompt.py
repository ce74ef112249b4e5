"""The per-prompt Prefect task: one call into hermes_core, policy in the decorator.

Caching: the key is the prompt's identity (record content + occurrence + the
run's defining settings), results are persisted, so a new flow run of the same
run or a retried flow run returns finished prompts from the cache instead of
calling the model. Failed prompts are never cached (Prefect caches only
Completed states). Transient failures (429/5xx/timeouts after the client's own
retries, a broken sandbox) are retried by Prefect's task retries.
"""

from __future__ import annotations

from functools import lru_cache

from prefect import task
from prefect.runtime import task_run
from prefect.serializers import CompressedSerializer

from hermes_core.exceptions import ModelError, PromptTimeout, SandboxError
from hermes_core.runner import PromptJob, PromptOutcome, RunSpec, run_prompt
from hermes_core.settings import HermesSettings

CACHE_KEY_PREFIX = "hermes-prompt-"


def prompt_cache_key(context, parameters: dict) -> str:
    """Cache key of a prompt task: its identity (the spec and secret name are not hashed)."""
    return CACHE_KEY_PREFIX + parameters["job"].prompt_id


def is_transient(task, task_run, state) -> bool:
    """Retry condition: retry only errors a later attempt may not see again."""
    exc = state.result(raise_on_failure=False)
    if isinstance(exc, ModelError):
        return exc.retryable
    return isinstance(exc, SandboxError | PromptTimeout | OSError)


@lru_cache(maxsize=8)
def _settings(api_key_secret: str | None) -> HermesSettings:
    if not api_key_secret:
        return HermesSettings()
    from prefect.blocks.system import Secret

    return HermesSettings(api_key=Secret.load(api_key_secret).get())


@task(
    name="run-prompt",
    task_run_name="prompt-{job.prompt_index}",
    cache_key_fn=prompt_cache_key,
    persist_result=True,
    # zlib, not Prefect's "compressed/pickle" (lzma): 4-6 ms less CPU per prompt (bench/ANALYSIS.md);
    # each stored result names its serializer, so results written with lzma stay readable.
    result_serializer=CompressedSerializer(serializer="pickle", compressionlib="zlib"),
    retries=1,
    retry_delay_seconds=[2, 10, 30],
    retry_condition_fn=is_transient,
)
def run_prompt_task(job: PromptJob, spec: RunSpec, api_key_secret: str | None = None) -> PromptOutcome:
    """Run one prompt (see :func:`hermes_core.runner.run_prompt`); raise on failure."""
    return run_prompt(job, spec, _settings(api_key_secret), attempt=task_run.run_count or 1)
