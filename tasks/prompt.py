"""The per-prompt Prefect task: one call into hermes_core, policy in the decorator.

Caching: the key is the run folder's identity (``spec.run_id``, a random id kept in run.json
and made anew by ``--overwrite``) plus the prompt's identity (record content + occurrence +
the run's defining settings). Results are persisted, so a new flow run of the same run or a
retried flow run returns finished prompts from the cache instead of calling the model, and a
run started again with ``--overwrite`` (or any other run folder) never gets an old result,
even when ``--result_storage`` is shared. Failed prompts are never cached (Prefect caches only
Completed states). Transient failures (429/5xx/timeouts after the client's own retries, a
broken sandbox) are retried by Prefect's task retries; a prompt that ran out of its
``--prompt_timeout`` is retried only with ``--retry_timeouts`` (it would pay twice).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache

from prefect import task
from prefect.runtime import task_run
from prefect.serializers import CompressedSerializer
from pydantic import SecretStr

from hermes_core import cancel
from hermes_core.exceptions import ModelError, PromptTimeout, SandboxError, ScorerError, UnexpectedError
from hermes_core.redaction import install_log_redaction, register_secret, scrub_exception
from hermes_core.runner import PromptJob, PromptOutcome, RunSpec, run_prompt
from hermes_core.settings import HermesSettings
from hermes_core.usage import Usage
from tasks.shared_limit import DEFAULT_LEASE_SECONDS, hold_slot

CACHE_KEY_PREFIX = "hermes-prompt-"

install_log_redaction()  # every process that runs prompts (flow process, Dask worker): no secret in a log

_provided_key: SecretStr | None = None


def provide_api_key(key: str) -> None:
    """Use ``key`` as the model API key of the prompts run in this process (``--api_key``).

    It is kept in memory only: never a Prefect parameter, never put in the environment (where a
    sandbox command or a child process could read it), and registered for redaction.
    """
    global _provided_key
    _provided_key = SecretStr(key)
    register_secret(key)
    settings_of.cache_clear()


def prompt_cache_key(context, parameters: dict) -> str:
    """Cache key of a prompt task: sha256 of (run folder identity, prompt identity), 32 hex chars."""
    identity = f"{parameters['spec'].run_id}|{parameters['job'].prompt_id}"
    return CACHE_KEY_PREFIX + hashlib.sha256(identity.encode()).hexdigest()[:32]


def retry_condition(*, retry_timeouts: bool = False) -> Callable[..., bool]:
    """The task's retry condition: retry only errors a later attempt may not see again.

    Args:
        retry_timeouts: also retry a prompt that ran past its ``--prompt_timeout``.
    """

    def is_transient(task, task_run, state) -> bool:
        exc = state.result(raise_on_failure=False)
        if isinstance(exc, ModelError | ScorerError):
            return exc.retryable
        if isinstance(exc, PromptTimeout):
            return retry_timeouts
        if isinstance(exc, UnexpectedError):
            return exc.os_error  # a host resource failed (it was an OSError)
        return isinstance(exc, SandboxError | OSError)

    return is_transient


@lru_cache(maxsize=8)
def settings_of(api_key_secret: str | None) -> HermesSettings:
    """The process's settings, with the API key of the Prefect Secret block ``api_key_secret`` when given
    (registered for redaction), else the key the command line was given, else the environment's."""
    if api_key_secret:
        from prefect.blocks.system import Secret

        key = Secret.load(api_key_secret).get()
        register_secret(key)
        return HermesSettings(api_key=key)
    if _provided_key is not None:
        return HermesSettings(api_key=_provided_key)
    return HermesSettings()


@task(
    name="run-prompt",
    task_run_name="prompt-{job.label}",
    cache_key_fn=prompt_cache_key,
    persist_result=True,
    # zlib, not Prefect's "compressed/pickle" (lzma): 4-6 ms less CPU per prompt (bench/ANALYSIS.md);
    # each stored result names its serializer, so results written with lzma stay readable.
    result_serializer=CompressedSerializer(serializer="pickle", compressionlib="zlib"),
    retries=1,
    retry_delay_seconds=[2, 10, 30],
    retry_condition_fn=retry_condition(),
)
def run_prompt_task(
    job: PromptJob,
    spec: RunSpec,
    api_key_secret: str | None = None,
    concurrency_limit: str | None = None,
    concurrency_lease_seconds: float = DEFAULT_LEASE_SECONDS,
) -> PromptOutcome:
    """Run one prompt (see :func:`hermes_core.runner.run_prompt`); raise on failure.

    With ``concurrency_limit`` (``--concurrency_limit``), the attempt holds one slot of that Prefect
    global concurrency limit while it runs, leased for ``concurrency_lease_seconds``
    (:func:`tasks.shared_limit.hold_slot`): it waits for a free slot first, so every model request
    of the prompt happens inside the slot.

    Raises:
        HermesError: the prompt failed (an exception of another library arrives as an
            :class:`~hermes_core.exceptions.UnexpectedError`), with ``attempts`` set to this
            attempt's number and ``usage`` to what this prompt's failed attempts in this process
            spent, summed, so the ledger records how many attempts really ran and what they
            cost. What Prefect gets (state message, result store, logs) is scrubbed of secrets
            (:func:`hermes_core.redaction.scrub_exception`).

    When a retry then succeeds, the earlier attempts' usage is added to the outcome's (and its
    row's) usage: a run's spend counts every attempt.
    """
    attempt = task_run.run_count or 1
    key = job.prompt_id
    try:
        with (
            cancel.prompt_in_flight(),  # counted from here: a stopped run's prompt waiting for a slot too
            hold_slot(
                concurrency_limit,
                lease_seconds=concurrency_lease_seconds,
                holder=task_run.id if concurrency_limit else None,
            ),
        ):
            outcome = run_prompt(job, spec, settings_of(api_key_secret), attempt=attempt)
    except Exception as exc:
        failure = scrub_exception(exc)
        failure.attempts = attempt
        failure.usage = Usage.total([_failed_usage.pop(key, None), failure.usage])
        if failure.usage is not None:
            _failed_usage[key] = failure.usage  # a task retry may follow; the flow settles it when none does
        if failure is exc:
            raise
        raise failure from None
    earlier = _failed_usage.pop(key, None)
    if earlier is not None:
        outcome.usage = (earlier + Usage.from_dict(outcome.usage)).as_dict()
        outcome.row["metadata"]["usage"] = outcome.usage
    return outcome


_failed_usage: dict[str, Usage] = {}
"""Usage of failed attempts of prompts that may still be retried in this process (prompt_id -> usage)."""


def settle_failed_usage(prompt_id: str) -> None:
    """Forget the failed attempts' usage of a prompt whose failure is recorded (no retry follows)."""
    _failed_usage.pop(prompt_id, None)
