"""Toolset ``web``: ``web_search`` and ``web_extract`` (schemas as the reference; see TOOLS.md section 3)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hermes_core.tools._pending import not_configured, refuse
from hermes_core.tools._registry import ToolContext, tool

_CHECK = not_configured("web")


@tool("web", check=_CHECK)
def web_search(ctx: ToolContext, query: str, limit: Annotated[int, Field(ge=1, le=100)] = 5) -> dict:
    """Search the web and return ranked results (title, url, description).

    Args:
        query: the search query.
        limit: number of results to return.
    """
    return refuse("web_search")


@tool("web", check=_CHECK)
def web_extract(
    ctx: ToolContext,
    urls: Annotated[list[str], Field(max_length=5)],
    char_limit: Annotated[int, Field(ge=2000)] = 15000,
) -> dict:
    """Fetch web pages and return their main content as text or markdown.

    Args:
        urls: up to 5 URLs to extract.
        char_limit: maximum characters of content per page.
    """
    return refuse("web_extract")
