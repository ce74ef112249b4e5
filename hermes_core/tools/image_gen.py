"""Toolset ``image_gen``: ``image_generate`` (schema as the reference; see TOOLS.md section 5)."""

from __future__ import annotations

from typing import Literal

from hermes_core.tools._pending import not_configured, refuse
from hermes_core.tools._registry import ToolContext, tool


@tool("image_gen", check=not_configured("image_gen"))
def image_generate(
    ctx: ToolContext, prompt: str, aspect_ratio: Literal["landscape", "square", "portrait"] = "landscape"
) -> dict:
    """Generate an image from a text description and return its URL.

    Args:
        prompt: description of the wanted image.
        aspect_ratio: landscape (16:9 wide), square (1:1) or portrait (16:9 tall).
    """
    return refuse("image_generate")
