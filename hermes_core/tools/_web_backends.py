"""Backends of the web toolset: Firecrawl, Tavily and SearXNG, plus a direct page fetch.

Each backend is spoken over plain HTTP (httpx through :mod:`hermes_core.tools._http`),
following the vendors' documented formats:

- Firecrawl v2 (https://docs.firecrawl.dev/api-reference): ``POST /v2/search``
  ``{query, limit}`` -> ``{"success", "data": {"web": [{url, title, description, position}]}}``
  and ``POST /v2/scrape`` ``{url, formats: ["markdown"], onlyMainContent}`` ->
  ``{"success", "data": {"markdown", "metadata": {title, statusCode, error}}}``; bearer key,
  optional for a self-hosted instance.
- Tavily (https://docs.tavily.com): ``POST /search`` ``{query, max_results}`` ->
  ``{"results": [{title, url, content, score}]}`` and ``POST /extract`` ``{urls, format}`` ->
  ``{"results": [{url, raw_content}], "failed_results": [{url, error}]}``; bearer key.
- SearXNG (https://docs.searxng.org/dev/search_api.html): ``GET /search?q=..&format=json``
  -> ``{"results": [{url, title, content}]}``; search only, pages are fetched directly.
- Direct fetch: ``GET`` the page and turn HTML into markdown with trafilatura
  (main content, links and tables kept; its baseline text when nothing is found).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hermes_core.settings import HermesSettings
from hermes_core.tools._http import HttpError, request

FIRECRAWL_DEFAULT_URL = "https://api.firecrawl.dev"
_TEXT_TYPES = (
    "text/html",
    "application/xhtml+xml",
    "text/plain",
    "text/markdown",
    "application/xml",
    "text/xml",
)


@dataclass
class Page:
    """One extracted page: ``content`` is markdown/text, ``error`` a message when it failed."""

    url: str
    title: str = ""
    content: str = ""
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{url, title, content, error}`` as in the reference's web_extract results."""
        return {"url": self.url, "title": self.title, "content": self.content, "error": self.error}


def configured_backend(settings: HermesSettings) -> str | None:
    """The web backend in use: ``firecrawl``, ``tavily``, ``searxng``, or None when none is configured.

    ``web_backend="auto"`` takes the first configured in that order; a named backend
    counts only when its key/URL is set.
    """
    configured = {
        "firecrawl": bool(settings.firecrawl_api_key or settings.firecrawl_api_url),
        "tavily": bool(settings.tavily_api_key),
        "searxng": bool(settings.searxng_url),
    }
    if settings.web_backend != "auto":
        return settings.web_backend if configured[settings.web_backend] else None
    return next((name for name, ok in configured.items() if ok), None)


def unavailable_reason(settings: HermesSettings) -> str | None:
    """Availability check of web_search / web_extract: None when a backend is configured."""
    if configured_backend(settings) is not None:
        return None
    if settings.web_backend != "auto":
        return f"web backend {settings.web_backend!r} chosen but not configured (key or URL missing)"
    return (
        "no web backend configured: set FIRECRAWL_API_KEY, FIRECRAWL_API_URL, TAVILY_API_KEY or SEARXNG_URL"
    )


def _call(settings: HermesSettings, method: str, url: str, timeout: float, **kwargs: Any):
    return request(
        method,
        url,
        timeout=timeout,
        max_bytes=settings.web_max_bytes,
        retries=settings.web_max_retries,
        **kwargs,
    )


def _bearer(secret) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret.get_secret_value()}"} if secret else {}


def _firecrawl_base(settings: HermesSettings) -> str:
    return (settings.firecrawl_api_url or FIRECRAWL_DEFAULT_URL).rstrip("/")


# ----------------------------------------------------------------------------- search


def search(settings: HermesSettings, query: str, limit: int, timeout: float) -> list[dict[str, Any]]:
    """Ranked results ``[{title, url, description, position}]`` (at most ``limit``) from the backend.

    Raises:
        HttpError: the backend failed (vendor message), or answered in an unknown shape.
    """
    backend = configured_backend(settings)
    if backend == "firecrawl":
        data = _call(
            settings,
            "POST",
            f"{_firecrawl_base(settings)}/v2/search",
            timeout,
            headers=_bearer(settings.firecrawl_api_key),
            json={"query": query, "limit": limit},
        ).json()
        if isinstance(data, dict) and data.get("success") is False:
            raise HttpError(f"Firecrawl: {data.get('error') or 'search failed'}")
        items = (data or {}).get("data")
        items = items.get("web") if isinstance(items, dict) else items  # v2: data.web; v1: data
        raw = [
            (i.get("title"), i.get("url"), i.get("description")) for i in items or [] if isinstance(i, dict)
        ]
    elif backend == "tavily":
        data = _call(
            settings,
            "POST",
            f"{settings.tavily_api_url.rstrip('/')}/search",
            timeout,
            headers=_bearer(settings.tavily_api_key),
            json={"query": query, "max_results": limit, "search_depth": "basic"},
        ).json()
        items = data.get("results") if isinstance(data, dict) else None
        raw = [(i.get("title"), i.get("url"), i.get("content")) for i in items or [] if isinstance(i, dict)]
    elif backend == "searxng":
        data = _call(
            settings,
            "GET",
            f"{settings.searxng_url.rstrip('/')}/search",
            timeout,
            params={"q": query, "format": "json"},
        ).json()
        items = data.get("results") if isinstance(data, dict) else None
        raw = [(i.get("title"), i.get("url"), i.get("content")) for i in items or [] if isinstance(i, dict)]
    else:
        raise HttpError(unavailable_reason(settings) or "no web backend")
    results = []
    for title, url, description in raw:
        if not url:
            continue
        results.append(
            {"title": title or "", "url": url, "description": description or "", "position": len(results) + 1}
        )
        if len(results) >= limit:
            break
    return results


# ----------------------------------------------------------------------------- extraction


def html_to_markdown(page_html: str, url: str | None = None) -> tuple[str, str]:
    """``(title, markdown)`` of an HTML page: trafilatura's main content with links and tables.

    Falls back to trafilatura's baseline text (all visible paragraphs) when the
    main-content extraction finds nothing (very short pages).
    """
    import trafilatura

    match = re.search(r"<title[^>]*>(.*?)</title>", page_html, re.IGNORECASE | re.DOTALL)
    title = " ".join(html.unescape(match.group(1)).split()) if match else ""
    text = trafilatura.extract(
        page_html,
        url=url,
        output_format="markdown",
        include_links=True,
        include_tables=True,
        include_images=False,
        favor_recall=True,
    )
    if not text:
        text = trafilatura.baseline(page_html)[1]
    if not title:
        meta = trafilatura.extract_metadata(page_html)
        title = (meta.title if meta else "") or ""
    return title, (text or "").strip()


def fetch_page(settings: HermesSettings, url: str, timeout: float) -> Page:
    """Fetch ``url`` directly and convert it to markdown (text pages as they are); errors go in ``Page.error``."""
    try:
        result = _call(
            settings,
            "GET",
            url,
            timeout,
            check_address=settings.web_block_private_addresses,
            headers={"Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5"},
        )
    except HttpError as exc:
        return Page(url=url, error=str(exc))
    ctype = result.headers.get("content-type", "text/html").split(";")[0].strip().lower()
    if ctype not in _TEXT_TYPES:
        return Page(url=url, error=f"unsupported content type {ctype!r}")
    body = result.text()
    if ctype in ("text/html", "application/xhtml+xml") or body.lstrip()[:15].lower().startswith(
        "<!doctype html"
    ):
        title, content = html_to_markdown(body, result.url)
    else:
        title, content = "", body.strip()
    if not content:
        return Page(url=url, title=title, error="no text content found on the page")
    return Page(url=url, title=title, content=content)


def _firecrawl_scrape(settings: HermesSettings, url: str, timeout: float) -> Page:
    try:
        data = _call(
            settings,
            "POST",
            f"{_firecrawl_base(settings)}/v2/scrape",
            timeout,
            headers=_bearer(settings.firecrawl_api_key),
            json={"url": url, "formats": ["markdown"], "onlyMainContent": True},
        ).json()
    except HttpError as exc:
        return Page(url=url, error=str(exc))
    if not isinstance(data, dict) or data.get("success") is False:
        return Page(url=url, error=str((data or {}).get("error") or "scrape failed"))
    doc = data.get("data") or {}
    meta = doc.get("metadata") or {}
    status = meta.get("statusCode")
    if isinstance(status, int) and status >= 400:
        return Page(url=url, title=meta.get("title") or "", error=meta.get("error") or f"HTTP {status}")
    content = (doc.get("markdown") or "").strip()
    return Page(
        url=url, title=meta.get("title") or "", content=content, error=None if content else "empty page"
    )


def _tavily_extract(settings: HermesSettings, urls: list[str], timeout: float) -> list[Page]:
    data = _call(
        settings,
        "POST",
        f"{settings.tavily_api_url.rstrip('/')}/extract",
        timeout,
        headers=_bearer(settings.tavily_api_key),
        json={"urls": urls, "format": "markdown", "extract_depth": "basic"},
    ).json()
    found: dict[str, Page] = {}
    for item in (data or {}).get("results") or []:
        content = (item.get("raw_content") or "").strip()
        heading = re.search(r"^#\s+(.+)$", content, re.MULTILINE)
        found[item.get("url")] = Page(
            url=item.get("url"),
            title=heading.group(1).strip() if heading else "",
            content=content,
            error=None if content else "empty page",
        )
    for item in (data or {}).get("failed_results") or []:
        found[item.get("url")] = Page(url=item.get("url"), error=item.get("error") or "extraction failed")
    return [found.get(url) or Page(url=url, error="not returned by Tavily") for url in urls]


def extract(settings: HermesSettings, urls: list[str], timeout: float) -> list[Page]:
    """Pages of ``urls`` (same order) through the configured backend; per-URL failures in ``Page.error``.

    Firecrawl scrapes each URL; Tavily extracts all in one call; SearXNG has no
    extraction, so pages are fetched directly.

    Raises:
        HttpError: a whole-call failure (Tavily); per-URL failures never raise.
    """
    backend = configured_backend(settings)
    if backend == "tavily":
        return _tavily_extract(settings, urls, timeout)
    one: Callable[[HermesSettings, str, float], Page] = (
        _firecrawl_scrape if backend == "firecrawl" else fetch_page
    )
    if len(urls) == 1:
        return [one(settings, urls[0], timeout)]
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        return list(pool.map(lambda u: one(settings, u, timeout), urls))
