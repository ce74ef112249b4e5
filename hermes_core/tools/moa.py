"""Toolset ``moa``: ``mixture_of_agents`` (schema as the reference; see TOOLS.md section 7)."""

from __future__ import annotations

from hermes_core.tools._pending import not_configured, refuse
from hermes_core.tools._registry import ToolContext, tool


@tool("moa", check=not_configured("moa"))
def mixture_of_agents(ctx: ToolContext, user_prompt: str) -> dict:
    """Route a hard problem through several models in parallel and combine their answers.

    Args:
        user_prompt: the problem to send to the reference models.
    """
    return refuse("mixture_of_agents")
