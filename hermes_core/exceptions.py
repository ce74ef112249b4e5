"""Typed endings of an agent run and the errors hermes_core raises.

Two families:

* :class:`AgentStop` ends the agent loop *with* a trajectory: the turn limit
  (``completed=False``), an output cut by length or repeated tool-call errors
  (``partial=True``). The loop catches the base class in one place.
* Every other :class:`HermesError` fails the prompt: provider errors after
  retries (:class:`ModelError`), a broken sandbox (:class:`SandboxError`), the
  per-prompt deadline (:class:`PromptTimeout`) and bad configuration
  (:class:`ConfigError`).

:class:`ToolError` is the one error that goes back to the model: it becomes an
error tool result (``{"error": ...}``) and counts in ``tool_error_counts``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    from hermes_core.usage import Usage


FailureKind = Literal["model", "provider", "infra"]
"""Who a failed prompt's failure belongs to (:attr:`HermesError.kind`)."""
FAILURE_KINDS: tuple[FailureKind, ...] = ("model", "provider", "infra")


class HermesError(Exception):
    """Root of every error raised by hermes_core, and the one type a failed prompt ends with.

    Its text arguments pass the process's secret redaction when it is made
    (:mod:`hermes_core.redaction`): a provider message that echoes the API key can reach the
    console, a log, a Prefect state or the result store only as ``[REDACTED]``.

    A prompt that fails ends with a HermesError whatever went wrong: an exception of another
    library is turned into an :class:`UnexpectedError` by
    :func:`hermes_core.redaction.scrub_exception` (``run_prompt`` and the prompt task do it).
    The error then carries what the ledger records of the failure (``failures.jsonl``,
    ``cancelled.jsonl``: README § Outputs).

    Attributes:
        usage: what the prompt spent before this error ended it (tokens, cost in USD): set by
            :func:`hermes_core.runner.run_prompt` and summed over the failed attempts by the
            prompt task; None when nothing is known (the error came before any model call).
        attempts: the attempts of the prompt that ran, this one included (1 = the first); set by
            the prompt task.
        kind: who failed, as ``failures.jsonl`` records it: ``model`` (the sample itself: it ran
            past its deadline...), ``provider`` (the model API: :class:`ModelError`) or ``infra``
            (this machine: the sandbox or container broke, a configuration or an unexpected
            error). Statistics count each kind apart; an ``infra`` failure says nothing of the
            model.
    """

    usage: Usage | None = None
    attempts: int = 1
    kind: ClassVar[FailureKind] = "model"

    def __init__(self, *args: object):
        if args:
            from hermes_core.redaction import redact, valid_text

            args = tuple(redact(valid_text(a)) if isinstance(a, str) else a for a in args)
        super().__init__(*args)

    @property
    def error_type(self) -> str:
        """The name ``failures.jsonl`` records as ``error_type``: the class name."""
        return type(self).__name__


class UnexpectedError(HermesError):
    """An exception of another library that ended a prompt, carried on as text only.

    Args:
        error_type: the original exception's class name.
        message: its (redacted) text.
        os_error: the original was an ``OSError`` (a host resource failed: the prompt task's
            retry policy treats it as transient); its text is kept as it was, without the class
            name in front.

    Attributes:
        error_type: the original exception's class name (``failures.jsonl`` records it).
        os_error: as the argument.
    """

    kind: ClassVar[FailureKind] = "infra"

    def __init__(self, error_type: str, message: str, *, os_error: bool = False):
        if os_error:
            super().__init__(message)
        else:
            super().__init__(f"{error_type}: {message}" if message else error_type)
        self._error_type = error_type
        self.os_error = os_error

    @property
    def error_type(self) -> str:
        """The original exception's class name."""
        return self._error_type

    def __reduce__(self):
        # pickled with its own arguments (a Dask worker, the result store); fields ride in __dict__
        return (_rebuild_unexpected, (type(self), self.args), self.__dict__)


def _rebuild_unexpected(cls: type[UnexpectedError], args: tuple) -> UnexpectedError:
    """An UnexpectedError of ``cls`` with ``args`` as they were (its fields come back from its state)."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    return error


class ConfigError(HermesError, ValueError):
    """Invalid configuration: unknown distribution, toolset, backend or option."""

    kind: ClassVar[FailureKind] = "infra"


class ToolError(HermesError):
    """A tool call the model got wrong or that the tool reports as failed.

    The message is sent back to the model as ``{"error": message}``.
    """


class SandboxError(HermesError):
    """The prompt's environment could not be created or broke (not a failing command)."""

    kind: ClassVar[FailureKind] = "infra"


class ModelError(HermesError):
    """The model API failed after retries, or refused the request (non-retryable 4xx).

    Attributes:
        status_code: HTTP status of the last response, or None (timeout, connection).
        retryable: True when the error kind is transient (429, 5xx, timeout,
            connection) and a later attempt of the whole prompt may succeed.
        retry_after: seconds the provider asked to wait (``Retry-After``), or None.
    """

    kind: ClassVar[FailureKind] = "provider"

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.retryable = retryable
        self.retry_after = retry_after


class ScorerError(HermesError):
    """A scorer could not give a result: the judge's request failed after its retries (an errored
    sample, not a failed one: it never becomes a row and is retried like a transient error).

    Attributes:
        retryable: True when a later attempt may succeed (the judge's error was transient).
    """

    kind: ClassVar[FailureKind] = "infra"

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class PromptTimeout(HermesError):
    """The per-prompt wall-clock deadline passed (checked between turns and bounding tool timeouts)."""


class PromptCancelled(HermesError):
    """The run is being stopped (Ctrl-C, cancellation): the prompt ends without a trajectory."""


class AgentStop(HermesError):
    """Base of the endings that still produce a trajectory row.

    Attributes:
        completed: value of the row's ``completed`` field.
        partial: value of the row's ``partial`` field.
    """

    completed: bool = True
    partial: bool = False


class TurnLimitReached(AgentStop):
    """``max_turns`` model calls were made and the model still wanted tools."""

    completed = False


class OutputTruncated(AgentStop):
    """The model's output was cut by the length limit (``finish_reason == "length"``)."""

    partial = True


class RepeatedToolErrors(AgentStop):
    """``max_consecutive_tool_errors`` (3) tool calls in a row named an unknown tool or had invalid JSON arguments."""

    partial = True


__all__ = [
    "FAILURE_KINDS",
    "AgentStop",
    "ConfigError",
    "FailureKind",
    "HermesError",
    "ModelError",
    "OutputTruncated",
    "PromptCancelled",
    "PromptTimeout",
    "RepeatedToolErrors",
    "SandboxError",
    "ScorerError",
    "ToolError",
    "TurnLimitReached",
    "UnexpectedError",
]
