"""Auxiliary model calls of the vision and moa tools, through the run's model client code.

Endpoint resolution (documented in docs/toolsets.md): a tool's own settings
(``vision_base_url`` / ``moa_base_url``, with ``vision_api_key`` / ``moa_api_key``,
else the model API key) win; otherwise the run's endpoint and key from
``ToolContext.model_endpoint`` are used, so a run against the ``mock/`` model or
any OpenAI-compatible provider gets vision and MoA with no extra setting. The
model id is the tool's setting, else the run's model. Calls go through
:class:`hermes_core.client.ModelClient` (the openai SDK's retries, ``Retry-After``
honoured, provider messages in errors). A call to the run's endpoint takes a slot of the
run's request limiter; every answered call's usage is added to the prompt's
(``ToolContext.add_usage``), so the row, the ledger and the spend cap count it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from hermes_core.client import ModelClient, ModelOptions
from hermes_core.endpoints import is_local_endpoint
from hermes_core.exceptions import ConfigError, ModelError
from hermes_core.limiter import ConcurrencyLimiter
from hermes_core.spend_guard import RequestGuard
from hermes_core.tools._registry import ToolContext

_THINK = re.compile(r"<(think|REASONING_SCRATCHPAD)>.*?</\1>\s*", re.DOTALL)


class AuxModelError(Exception):
    """An auxiliary model call failed (no endpoint, provider error after retries, empty answer)."""


@dataclass(frozen=True)
class AuxEndpoint:
    """Where an auxiliary call goes: endpoint, key, model id, the limiter of its requests (or None)
    and the run's spend cap (its usage counts in the prompt's, wherever it goes; or None)."""

    base_url: str
    api_key: SecretStr | None
    model: str
    limiter: ConcurrencyLimiter | None = None
    guard: RequestGuard | None = None


def own_endpoint_problem(
    base_url: str | None, own_key: SecretStr | None, main_key: SecretStr | None
) -> str | None:
    """Availability of a tool with its own endpoint setting: None when usable (key known or local endpoint)."""
    if base_url and not (own_key or main_key or is_local_endpoint(base_url)):
        return f"{base_url} is set but has no API key"
    return None


def resolve(
    ctx: ToolContext, *, model: str | None, base_url: str | None, api_key: SecretStr | None
) -> AuxEndpoint:
    """The endpoint of an auxiliary call: the tool's settings, else the run's endpoint, key and model.

    Raises:
        AuxModelError: no endpoint or no model id can be found (outside a run, nothing set).
    """
    run = ctx.model_endpoint
    url = base_url or (run.base_url if run else None)
    if not url:
        raise AuxModelError("no model endpoint: set the tool's base URL setting or run inside a batch run")
    key = (api_key or ctx.settings.api_key) if base_url else (run.api_key if run else None)
    model_id = model or (run.model if run else None)
    if not model_id:
        raise AuxModelError("no model id: set the tool's model setting")
    limiter = run.limiter if run and not base_url else None  # the tool's own endpoint is not the run's
    return AuxEndpoint(url, key, model_id, limiter, run.guard if run else None)


def complete(ctx: ToolContext, endpoint: AuxEndpoint, messages: list[dict[str, Any]], timeout: float) -> str:
    """The text answer of one Chat Completions call (reasoning blocks removed).

    Raises:
        AuxModelError: configuration problem, provider error after retries, or an empty answer.
    """
    try:
        client = ModelClient(
            ModelOptions(model=endpoint.model),
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            timeout=timeout,
            max_retries=ctx.settings.max_retries,
            limiter=endpoint.limiter,
            guard=endpoint.guard,
        )
        turn = client.complete(messages, [], timeout=ctx.bound_timeout(timeout), deadline=ctx.deadline)
    except (ConfigError, ModelError) as exc:
        raise AuxModelError(f"{endpoint.model}: {exc}") from None
    ctx.add_usage(turn.usage)
    text = _THINK.sub("", turn.message.get("content") or "").strip()
    if not text:
        raise AuxModelError(f"{endpoint.model} returned an empty answer")
    return text
