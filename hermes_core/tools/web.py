"""Toolset ``web``: ``web_search`` and ``web_extract`` (the Hermes agent's reference tool, docs/toolsets.md; later revision).

Backends: Firecrawl, Tavily or SearXNG (:mod:`hermes_core.tools._web_backends`),
chosen by ``settings.web_backend``; the tools are offered only when one is
configured. ``web_extract`` returns a head+tail window of ``char_limit``
characters per page; a longer page's full text is saved in the prompt's
environment under ``.hermes/web/`` and the window says where (read it with
``read_file``). Inline base64 images are removed. With
``settings.web_block_private_addresses`` (default on), URLs whose host is or
resolves to a loopback/private/internal address get a per-URL ``Blocked`` error.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from pydantic import Field

from hermes_core.tools._http import HttpError, blocked_reason
from hermes_core.tools._registry import ToolContext, tool
from hermes_core.tools._web_backends import Page, extract, search, unavailable_reason

WEB_CACHE_DIR = ".hermes/web"
"""Where full page texts longer than ``char_limit`` are saved, relative to the prompt's working directory."""

_DATA_IMAGE_MD = re.compile(r"!\[[^\]]*\]\(data:[^)]*\)")
_DATA_URI = re.compile(r"data:image/[a-zA-Z0-9.+-]+;base64,[A-Za-z0-9+/=\s]{64,}")


@tool("web", check=unavailable_reason)
def web_search(ctx: ToolContext, query: str, limit: Annotated[int, Field(ge=1, le=100)] = 5) -> dict:
    """Search the web and return ranked results (title, url, description).

    Args:
        query: the search query.
        limit: number of results to return.
    """
    try:
        results = search(ctx.settings, query, limit, ctx.bound_timeout(ctx.settings.web_timeout))
    except HttpError as exc:
        return {"error": f"Error searching web: {exc}"}
    return {"success": True, "data": {"web": results}}


def strip_inline_images(text: str) -> str:
    """``text`` without markdown images or bare URIs that carry base64 data."""
    return _DATA_URI.sub("[inline image removed]", _DATA_IMAGE_MD.sub("", text))


def window(ctx: ToolContext, page: Page, char_limit: int) -> str:
    """Page content bounded to about ``char_limit`` characters: its head and tail around a pointer.

    The full text is written to ``.hermes/web/<sha>.md`` in the prompt's environment
    and the pointer names that path.
    """
    text = page.content
    if len(text) <= char_limit:
        return text
    path = f"{WEB_CACHE_DIR}/{hashlib.sha256(page.url.encode()).hexdigest()[:12]}.md"
    ctx.env.write_file(path, text.encode("utf-8"))
    omitted = len(text) - char_limit
    note = (
        f"\n\n[... about {omitted} characters omitted; the full text ({len(text)} characters) "
        f"is saved at {path}: read it with read_file ...]\n\n"
    )
    budget = max(0, char_limit - len(note))
    head = budget * 3 // 4
    tail = budget - head
    return text[:head] + note + (text[-tail:] if tail else "")


@tool("web", check=unavailable_reason)
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
    urls = [u.strip() for u in urls[:5] if u.strip()]
    if not urls:
        return {"error": "Error extracting content: no URL given"}
    pages: dict[int, Page] = {}
    allowed: list[tuple[int, str]] = []
    blocked = False
    for i, url in enumerate(urls):
        reason = blocked_reason(url) if ctx.settings.web_block_private_addresses else None
        if reason:
            pages[i] = Page(url=url, error=f"Blocked: {reason}")
            blocked = True
        else:
            allowed.append((i, url))
    if allowed:
        timeout = ctx.bound_timeout(ctx.settings.web_timeout)
        try:
            fetched = extract(ctx.settings, [u for _, u in allowed], timeout)
        except HttpError as exc:
            return {"error": f"Error extracting content: {exc}"}
        pages.update({i: page for (i, _), page in zip(allowed, fetched, strict=True)})
    results = []
    for i in range(len(urls)):
        page = pages[i]
        if page.content:
            page.content = window(
                ctx, Page(page.url, page.title, strip_inline_images(page.content)), char_limit
            )
        results.append(page.as_dict())
    if not any(r["content"] for r in results):
        details = "; ".join(f"{r['url']}: {r['error']}" for r in results if r["error"])
        return {"error": "Content was inaccessible or not found" + (f" ({details})" if details else "")}
    out: dict = {"results": results}
    if blocked:
        out["blocked_by_policy"] = True
    return out


__all__ = ["WEB_CACHE_DIR", "strip_inline_images", "web_extract", "web_search", "window"]
