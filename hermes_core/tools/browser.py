"""Toolset ``browser``: the ten ``browser_*`` tools (schemas as the reference; see TOOLS.md section 6)."""

from __future__ import annotations

from typing import Literal

from hermes_core.tools._pending import not_configured, refuse
from hermes_core.tools._registry import ToolContext, tool

_CHECK = not_configured("browser")


@tool("browser", check=_CHECK)
def browser_navigate(ctx: ToolContext, url: str) -> dict:
    """Open a URL in the prompt's browser page.

    Args:
        url: the address to open.
    """
    return refuse("browser_navigate")


@tool("browser", check=_CHECK)
def browser_snapshot(ctx: ToolContext, full: bool = False) -> dict:
    """Return the page's accessibility tree as text, with element references (@eN).

    Args:
        full: include every element instead of the interactive ones.
    """
    return refuse("browser_snapshot")


@tool("browser", check=_CHECK)
def browser_click(ctx: ToolContext, ref: str) -> dict:
    """Click the element with the given reference.

    Args:
        ref: element reference from the snapshot, e.g. @e5.
    """
    return refuse("browser_click")


@tool("browser", check=_CHECK)
def browser_type(ctx: ToolContext, ref: str, text: str) -> dict:
    """Clear an input element and type text into it.

    Args:
        ref: element reference from the snapshot.
        text: the text to type.
    """
    return refuse("browser_type")


@tool("browser", check=_CHECK)
def browser_scroll(ctx: ToolContext, direction: Literal["up", "down"]) -> dict:
    """Scroll the page.

    Args:
        direction: up or down.
    """
    return refuse("browser_scroll")


@tool("browser", check=_CHECK)
def browser_back(ctx: ToolContext) -> dict:
    """Go back to the previous page."""
    return refuse("browser_back")


@tool("browser", check=_CHECK)
def browser_press(ctx: ToolContext, key: str) -> dict:
    """Press a keyboard key in the page.

    Args:
        key: key name, e.g. Enter, Tab, Escape, ArrowDown.
    """
    return refuse("browser_press")


@tool("browser", check=_CHECK)
def browser_get_images(ctx: ToolContext) -> dict:
    """List the images of the page (src, alt, width, height)."""
    return refuse("browser_get_images")


@tool("browser", check=_CHECK)
def browser_vision(ctx: ToolContext, question: str) -> dict:
    """Take a screenshot of the page and answer a question about it.

    Args:
        question: what to answer about the page's appearance.
    """
    return refuse("browser_vision")


@tool("browser", check=_CHECK)
def browser_console(ctx: ToolContext, clear: bool = False) -> dict:
    """Return the page's console messages and JavaScript errors.

    Args:
        clear: clear the collected messages after reading them.
    """
    return refuse("browser_console")
