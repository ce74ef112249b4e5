"""Toolset ``browser``: the ten ``browser_*`` tools (the Hermes agent's reference tools, docs/toolsets.md) on a real headless Chromium.

Playwright drives the system's Chromium (:mod:`hermes_core.tools.browser_session`:
one browser per process, one context per prompt, closed at the prompt's
teardown). ``browser_snapshot`` is Playwright's accessibility snapshot in its
``ai`` mode, where every element carries ``[ref=eN]``; the model names elements
as ``@eN`` (``eN`` is accepted too) and the tools resolve them with Playwright's
``aria-ref=eN`` selector. The compact snapshot (``full=false``, also returned by
``browser_navigate``) lists headings and interactive elements only. Snapshots
over :data:`SNAPSHOT_MAX_CHARS` are truncated. Navigation accepts http(s) only,
refuses cloud-metadata hosts and URLs that look like they carry secrets, and,
when ``web_block_private_addresses`` is on, every request of the context to a
private/internal address. Failures are ``{"success": false, "error": ...}``.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from hermes_core.exceptions import ConfigError
from hermes_core.settings import HermesSettings
from hermes_core.tools import _aux_model
from hermes_core.tools._http import blocked_reason
from hermes_core.tools._registry import ToolContext, tool
from hermes_core.tools.browser_session import BrowserError, BrowserSession
from hermes_core.tools.browser_session import unavailable_reason as _browser_unavailable
from hermes_core.tools.vision import ImageError, ask_vision_model, to_data_url
from hermes_core.tools.vision import unavailable_reason as _vision_unavailable

SNAPSHOT_MAX_CHARS = 15_000
SCREENSHOT_DIR = ".hermes/browser"
MAX_IMAGES = 100
INTERACTIVE_ROLES = frozenset(
    "button checkbox combobox link listbox menuitem menuitemcheckbox menuitemradio option radio "
    "searchbox slider spinbutton switch tab textbox treeitem".split()
)
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "100.100.100.200", "fd00:ec2::254"})
_SECRET = re.compile(
    r"(sk-[A-Za-z0-9_-]{20,}|ghp_[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9-]{10,}"
    r"|(api[_-]?key|access[_-]?token|secret|password)=[^&\s]{8,})",
    re.IGNORECASE,
)
_LINE = re.compile(r"^\s*- (?P<role>[a-z]+)\b(?P<rest>.*)$")
_REF = re.compile(r"^(?:\[?ref=|@)?((?:f\d+)?e\d+)\]?$")

_IMAGES_JS = """() => Array.from(document.images).map(i => ({
    src: i.currentSrc || i.src || "", alt: i.alt || "",
    width: i.naturalWidth || i.width || 0, height: i.naturalHeight || i.height || 0,
}))"""


def _check(settings: HermesSettings) -> str | None:
    return _browser_unavailable(settings)


def _check_with_vision(settings: HermesSettings) -> str | None:
    return _browser_unavailable(settings) or _vision_unavailable(settings)


def compact_snapshot(snapshot: str) -> str:
    """Headings and interactive elements of an ``ai``-mode aria snapshot, one flat line each."""
    lines = []
    for line in snapshot.splitlines():
        match = _LINE.match(line)
        if not match or "[ref=" not in line:
            continue
        role = match.group("role")
        if role in INTERACTIVE_ROLES or role == "heading":
            rest = match.group("rest").replace(" [cursor=pointer]", "").rstrip()
            lines.append(f"- {role}{rest[:-1] if rest.endswith(':') else rest}")
    return "\n".join(lines)


def _bounded(text: str) -> str:
    if len(text) <= SNAPSHOT_MAX_CHARS:
        return text
    return (
        text[:SNAPSHOT_MAX_CHARS]
        + f"\n[... snapshot truncated: {len(text) - SNAPSHOT_MAX_CHARS} more characters]"
    )


async def _snapshot(page: Any, full: bool) -> str:
    raw = await page.aria_snapshot(mode="ai")
    return _bounded(raw if full else compact_snapshot(raw))


def _ref(ref: str) -> str:
    match = _REF.match(ref.strip())
    if not match:
        raise BrowserError(f"invalid element reference {ref!r}: use a ref from the snapshot, like @e5")
    return match.group(1)


def navigation_problem(url: str, settings: HermesSettings) -> str | None:
    """Why ``url`` may not be opened, or None: scheme, cloud-metadata host, secret-looking URL, private address."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"only http and https URLs can be opened (got {parts.scheme or 'no scheme'!r})"
    host = (parts.hostname or "").lower()
    try:
        is_link_local = ipaddress.ip_address(host).is_link_local
    except ValueError:
        is_link_local = False
    if host in METADATA_HOSTS or is_link_local:
        return f"Blocked: {host} is a cloud metadata address"
    if _SECRET.search(url):
        return "Blocked: the URL looks like it contains an API key or secret"
    if settings.web_block_private_addresses and (reason := blocked_reason(url)):
        return f"Blocked: {reason}"
    return None


def prompt_session(ctx: ToolContext) -> BrowserSession:
    """The prompt's browser session, created (and its teardown registered) on first use."""
    session = ctx.state.get("browser")
    if session is None:
        session = BrowserSession(ctx.settings)
        session.open(ctx.bound_timeout(ctx.settings.browser_timeout * 2))
        ctx.state["browser"] = session
        ctx.cleanups.append(session.close)
    return session


def _run(ctx: ToolContext, action, timeout: float | None = None) -> dict:
    """Run ``action(page) -> dict`` in the prompt's session; browser failures become ``{success: false}``."""
    from playwright.async_api import Error as PlaywrightError

    try:
        session = prompt_session(ctx)
        seconds = ctx.bound_timeout(timeout or ctx.settings.browser_timeout)
        return session.call(lambda page: action(session, page, seconds * 1000), seconds)
    except (BrowserError, PlaywrightError) as exc:
        message = str(exc).split("\nCall log:")[0].strip()
        return {"success": False, "error": message[:1000]}


async def _locate(page: Any, ref: str) -> Any:
    locator = page.locator(f"aria-ref={_ref(ref)}")
    if await locator.count() == 0:
        raise BrowserError(f"element @{_ref(ref)} not found on the page: take a new browser_snapshot")
    return locator


_SUBMIT_KEYS = frozenset({"Enter", "NumpadEnter"})


async def _settle(page: Any, ms: float) -> None:
    """Wait (briefly) for a navigation a click or key press may have started."""
    try:
        await page.wait_for_load_state("domcontentloaded", timeout=min(ms, 5000))
    except Exception:  # noqa: BLE001 - no navigation, or a slow one: the next command will tell
        pass


@tool("browser", check=_check)
def browser_navigate(ctx: ToolContext, url: str) -> dict:
    """Open a URL in the prompt's browser page.

    Args:
        url: the address to open.
    """
    problem = navigation_problem(url.strip(), ctx.settings)
    if problem:
        return {"success": False, "error": problem}

    async def go(session, page, ms):
        await page.goto(url.strip(), wait_until="domcontentloaded", timeout=ms)
        try:
            await page.wait_for_load_state("load", timeout=min(ms, 10_000))
        except Exception:  # noqa: BLE001 - slow sub-resources do not fail the navigation
            pass
        snapshot = await _snapshot(page, full=False)
        return {
            "success": True,
            "url": page.url,
            "title": await page.title(),
            "snapshot": snapshot,
            "element_count": snapshot.count("[ref="),
        }

    return _run(ctx, go, ctx.settings.browser_timeout * 2)


@tool("browser", check=_check)
def browser_snapshot(ctx: ToolContext, full: bool = False) -> dict:
    """Return the page's accessibility tree as text, with element references (@eN).

    Args:
        full: include every element instead of the interactive ones.
    """

    async def snap(session, page, ms):
        snapshot = await _snapshot(page, full)
        return {"success": True, "snapshot": snapshot, "element_count": snapshot.count("[ref=")}

    return _run(ctx, snap)


@tool("browser", check=_check)
def browser_click(ctx: ToolContext, ref: str) -> dict:
    """Click the element with the given reference.

    Args:
        ref: element reference from the snapshot, e.g. @e5.
    """

    async def click(session, page, ms):
        await (await _locate(page, ref)).click(timeout=ms)
        await _settle(session.page, ms)
        return {"success": True, "clicked": f"@{_ref(ref)}"}

    return _run(ctx, click)


@tool("browser", check=_check)
def browser_type(ctx: ToolContext, ref: str, text: str) -> dict:
    """Clear an input element and type text into it.

    Args:
        ref: element reference from the snapshot.
        text: the text to type.
    """

    async def fill(session, page, ms):
        await (await _locate(page, ref)).fill(text, timeout=ms)
        return {"success": True, "typed": text, "element": f"@{_ref(ref)}"}

    return _run(ctx, fill)


@tool("browser", check=_check)
def browser_scroll(ctx: ToolContext, direction: Literal["up", "down"]) -> dict:
    """Scroll the page.

    Args:
        direction: up or down.
    """
    sign = -1 if direction == "up" else 1

    async def scroll(session, page, ms):
        await page.evaluate("s => window.scrollBy(0, s * Math.round(window.innerHeight * 0.8))", sign)
        return {"success": True, "scrolled": direction}

    return _run(ctx, scroll)


@tool("browser", check=_check)
def browser_back(ctx: ToolContext) -> dict:
    """Go back to the previous page."""

    async def back(session, page, ms):
        before = page.url
        response = await page.go_back(wait_until="domcontentloaded", timeout=ms)
        if response is None and page.url == before:
            return {"success": False, "error": "there is no previous page in this tab's history"}
        return {"success": True, "url": page.url}

    return _run(ctx, back)


@tool("browser", check=_check)
def browser_press(ctx: ToolContext, key: str) -> dict:
    """Press a keyboard key in the page.

    Args:
        key: key name, e.g. Enter, Tab, Escape, ArrowDown.
    """

    async def press(session, page, ms):
        if key in _SUBMIT_KEYS:  # may submit a form: wait for the navigation it starts, if any
            pressed = False
            try:
                async with page.expect_navigation(wait_until="domcontentloaded", timeout=min(ms, 1500)):
                    await page.keyboard.press(key)
                    pressed = True
            except Exception:
                if not pressed:
                    raise  # the key press itself failed
        else:
            await page.keyboard.press(key)
        await _settle(session.page, ms)
        return {"success": True, "pressed": key}

    return _run(ctx, press)


@tool("browser", check=_check)
def browser_get_images(ctx: ToolContext) -> dict:
    """List the images of the page (src, alt, width, height)."""

    async def images(session, page, ms):
        found = [i for i in await page.evaluate(_IMAGES_JS) if i["src"] and not i["src"].startswith("data:")]
        return {"success": True, "images": found[:MAX_IMAGES], "count": len(found)}

    return _run(ctx, images)


@tool("browser", check=_check_with_vision)
def browser_vision(ctx: ToolContext, question: str) -> dict:
    """Take a screenshot of the page and answer a question about it.

    Args:
        question: what to answer about the page's appearance.
    """

    async def shoot(session, page, ms):
        return {"success": True, "png": await page.screenshot(type="png", timeout=ms)}

    shot = _run(ctx, shoot)
    if not shot["success"]:
        return shot
    png = shot["png"]
    count = ctx.state.get("browser_screenshots", 0) + 1
    ctx.state["browser_screenshots"] = count
    relative = f"{SCREENSHOT_DIR}/screenshot_{count:03d}.png"
    ctx.env.write_file(relative, png)
    path = posixpath.join(ctx.env.cwd, relative)
    try:
        analysis = ask_vision_model(
            ctx, to_data_url(png, ctx.settings.vision_max_image_bytes, path), question
        )
    except (_aux_model.AuxModelError, ConfigError, ImageError) as exc:
        return {"success": False, "error": f"vision model: {exc}", "screenshot_path": path}
    return {"success": True, "analysis": analysis, "screenshot_path": path}


@tool("browser", check=_check)
def browser_console(ctx: ToolContext, clear: bool = False) -> dict:
    """Return the page's console messages and JavaScript errors.

    Args:
        clear: clear the collected messages after reading them.
    """

    async def read(session, page, ms):
        messages, errors = list(session.console), list(session.errors)
        if clear:
            session.console.clear()
            session.errors.clear()
        return {
            "success": True,
            "console_messages": messages,
            "js_errors": errors,
            "total_messages": len(messages),
            "total_errors": len(errors),
        }

    return _run(ctx, read)


__all__ = [
    "INTERACTIVE_ROLES",
    "MAX_IMAGES",
    "METADATA_HOSTS",
    "SCREENSHOT_DIR",
    "SNAPSHOT_MAX_CHARS",
    "browser_back",
    "browser_click",
    "browser_console",
    "browser_get_images",
    "browser_navigate",
    "browser_press",
    "browser_scroll",
    "browser_snapshot",
    "browser_type",
    "browser_vision",
    "compact_snapshot",
    "navigation_problem",
    "prompt_session",
]
