"""Toolset ``moa``: ``mixture_of_agents`` (the Hermes agent's reference tools, docs/toolsets.md).

Mixture-of-Agents (Wang et al. 2024, arXiv:2406.04692, one aggregation layer as
in the reference): the reference models answer the prompt in parallel; the
aggregator gets their answers and writes one response. One successful
reference answer is enough. Model ids come from ``moa_reference_models`` and
``moa_aggregator_model`` (empty = the run's own model); the endpoint and key
follow :mod:`hermes_core.tools._aux_model`. Retries are the model client's
(the openai SDK's, ``settings.max_retries``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from hermes_core.settings import HermesSettings
from hermes_core.tools import _aux_model
from hermes_core.tools._registry import ToolContext, tool

APOLOGY = (
    "I apologize, but the mixture of agents could not produce an answer to this problem; "
    "please try a different approach."
)

AGGREGATOR_PROMPT = (
    "Several assistants answered the user's question below. Their answers follow, numbered. "
    "Judge them critically: some may be wrong or incomplete. Write one answer of your own that keeps "
    "what is right in them, fixes what is wrong and is complete, clear and well organised. "
    "Do not mention the assistants or their numbering.\n\n{responses}"
)


def unavailable_reason(settings: HermesSettings) -> str | None:
    """None unless ``moa_base_url`` is set without any key (the default is the run's own endpoint)."""
    return _aux_model.own_endpoint_problem(settings.moa_base_url, settings.moa_api_key, settings.api_key)


@tool("moa", check=unavailable_reason)
def mixture_of_agents(ctx: ToolContext, user_prompt: str) -> dict:
    """Route a hard problem through several models in parallel and combine their answers.

    Args:
        user_prompt: the problem to send to the reference models.
    """
    settings = ctx.settings

    def endpoint(model: str | None) -> _aux_model.AuxEndpoint:
        return _aux_model.resolve(
            ctx, model=model, base_url=settings.moa_base_url, api_key=settings.moa_api_key
        )

    models_used = {"reference_models": [], "aggregator_model": None}
    try:
        references = [endpoint(m) for m in settings.moa_reference_models or [None]]
        aggregator = endpoint(settings.moa_aggregator_model)
    except _aux_model.AuxModelError as exc:
        return {"success": False, "response": APOLOGY, "models_used": models_used, "error": str(exc)}
    models_used = {"reference_models": [r.model for r in references], "aggregator_model": aggregator.model}

    def ask(ref: _aux_model.AuxEndpoint) -> str | Exception:
        try:
            return _aux_model.complete(
                ctx, ref, [{"role": "user", "content": user_prompt}], settings.moa_timeout
            )
        except _aux_model.AuxModelError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(references)) as pool:
        answers = list(pool.map(ask, references))
    good = [a for a in answers if isinstance(a, str)]
    if not good:
        errors = "; ".join(str(a) for a in answers)
        return {
            "success": False,
            "response": APOLOGY,
            "models_used": models_used,
            "error": f"every reference model failed: {errors}",
        }
    numbered = "\n\n".join(f"{i}. {answer}" for i, answer in enumerate(good, 1))
    messages = [
        {"role": "system", "content": AGGREGATOR_PROMPT.format(responses=numbered)},
        {"role": "user", "content": user_prompt},
    ]
    try:
        response = _aux_model.complete(ctx, aggregator, messages, settings.moa_timeout)
    except _aux_model.AuxModelError as exc:
        return {"success": False, "response": APOLOGY, "models_used": models_used, "error": str(exc)}
    return {"success": True, "response": response, "models_used": models_used}


__all__ = ["AGGREGATOR_PROMPT", "APOLOGY", "mixture_of_agents", "unavailable_reason"]
