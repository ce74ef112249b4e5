"""Toolset ``vision``: ``vision_analyze`` (schema as the reference; see TOOLS.md section 4)."""

from __future__ import annotations

from hermes_core.tools._pending import not_configured, refuse
from hermes_core.tools._registry import ToolContext, tool


@tool("vision", check=not_configured("vision"))
def vision_analyze(ctx: ToolContext, image_url: str, question: str) -> dict:
    """Analyse an image and answer a question about it.

    Args:
        image_url: http(s) URL, local file path or data: URL of the image.
        question: what to answer about the image.
    """
    return refuse("vision_analyze")
