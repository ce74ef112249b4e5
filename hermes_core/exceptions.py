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


class HermesError(Exception):
    """Root of every error raised by hermes_core.

    Its text arguments pass the process's secret redaction when it is made
    (:mod:`hermes_core.redaction`): a provider message that echoes the API key can reach the
    console, a log, a Prefect state or the result store only as ``[REDACTED]``.
    """

    def __init__(self, *args: object):
        if args:
            from hermes_core.redaction import redact, valid_text

            args = tuple(redact(valid_text(a)) if isinstance(a, str) else a for a in args)
        super().__init__(*args)


class UnexpectedError(HermesError):
    """An exception of another library that ended a prompt, carried on as text only.

    Attributes:
        error_type: the original exception's class name (``failures.jsonl`` records it).
    """

    def __init__(self, error_type: str, message: str):
        super().__init__(f"{error_type}: {message}" if message else error_type)
        self.error_type = error_type


class ConfigError(HermesError, ValueError):
    """Invalid configuration: unknown distribution, toolset, backend or option."""


class ToolError(HermesError):
    """A tool call the model got wrong or that the tool reports as failed.

    The message is sent back to the model as ``{"error": message}``.
    """


class SandboxError(HermesError):
    """The prompt's environment could not be created or broke (not a failing command)."""


class ModelError(HermesError):
    """The model API failed after retries, or refused the request (non-retryable 4xx).

    Attributes:
        status_code: HTTP status of the last response, or None (timeout, connection).
        retryable: True when the error kind is transient (429, 5xx, timeout,
            connection) and a later attempt of the whole prompt may succeed.
        retry_after: seconds the provider asked to wait (``Retry-After``), or None.
    """

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
