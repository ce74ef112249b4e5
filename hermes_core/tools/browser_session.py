"""One headless Chromium per process, one browser context per prompt (Playwright, async API).

Prompts run in many threads, and Playwright's objects belong to the event loop
that created them. So the process has one :class:`BrowserHost`: a daemon thread
running an asyncio loop that owns Playwright and the browser (launched lazily
from ``settings.browser_executable_path``, e.g. Debian's ``/usr/bin/chromium``;
never a downloaded build). Tool handlers, in any thread, submit coroutines to
it and wait with a timeout. Each prompt gets a :class:`BrowserSession` (its
own context: cookies, storage, pages) created on its first ``browser_*`` call
and closed by the prompt's ``ToolContext.close``. At most
``settings.browser_max_contexts`` contexts are open at once; further prompts
wait for a free one (up to twice ``browser_timeout``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import importlib.util
import ipaddress
import os
import shutil
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from hermes_core.settings import HermesSettings

T = TypeVar("T")

CHROMIUM_ARGS = [
    "--no-sandbox",  # root in containers has no user namespaces for the sandbox
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
MAX_LOG_ENTRIES = 500
"""Console messages and page errors kept per session (oldest dropped)."""


class BrowserError(Exception):
    """A browser command failed (timeout, crash, no free context, blocked address)."""


def find_chromium(settings: HermesSettings) -> str | None:
    """Path of the Chromium executable: the setting, else /usr/bin/chromium, else chromium on PATH."""
    if settings.browser_executable_path:
        path = settings.browser_executable_path
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium") or shutil.which("chromium-browser")


def unavailable_reason(settings: HermesSettings) -> str | None:
    """Availability of the browser tools: None when Playwright is installed and Chromium is found.

    Playwright is looked up, not imported (``find_spec``: its async API costs ~45 ms to import,
    which every run that checks its toolsets paid); the first browser tool call imports it.
    """
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install playwright; no browser download needed)"
    if find_chromium(settings) is None:
        where = settings.browser_executable_path or "/usr/bin/chromium or chromium on PATH"
        return f"Chromium not found ({where}); on Debian: apt-get install chromium"
    return None


def _non_global(host: str, addresses: list[str]) -> str | None:
    for addr in addresses:
        ip = ipaddress.ip_address(addr.split("%")[0])
        if not ip.is_global or ip.is_multicast:
            return f"{host} resolves to the private/internal address {ip}"
    return None


class BrowserHost:
    """The process's browser: a loop thread owning Playwright and one Chromium, launched on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots = threading.Condition()
        self._open = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._playwright: Any = None
        self._browser: Any = None
        self._launch_lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ loop thread
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="hermes-browser", daemon=True)
                thread.start()
                self._loop = loop
                atexit.register(self.shutdown)
            return self._loop

    def run(self, coro: Awaitable[T], timeout: float) -> T:
        """Run ``coro`` on the browser loop and wait up to ``timeout`` seconds for its result.

        Raises:
            BrowserError: the wait timed out (the coroutine is cancelled).
            Exception: whatever the coroutine raised (Playwright errors included).
        """
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise BrowserError(f"browser command timed out after {timeout:g} s") from None

    async def _browser_for(self, settings: HermesSettings) -> Any:
        if self._launch_lock is None:
            self._launch_lock = asyncio.Lock()
        async with self._launch_lock:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            from playwright.async_api import async_playwright

            if self._playwright is None:
                self._playwright = await async_playwright().start()
            executable = find_chromium(settings)
            if executable is None:
                raise BrowserError(unavailable_reason(settings) or "Chromium not found")
            self._browser = await self._playwright.chromium.launch(
                executable_path=executable, headless=settings.browser_headless, args=CHROMIUM_ARGS
            )
            return self._browser

    # ------------------------------------------------------------------ context slots
    def acquire_slot(self, limit: int, wait: float) -> None:
        """Take one of ``limit`` context slots, waiting up to ``wait`` seconds.

        Raises:
            BrowserError: no slot became free in time.
        """
        deadline = time.monotonic() + wait
        with self._slots:
            while self._open >= limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError(
                        f"all {limit} browser contexts of this process are in use (browser_max_contexts); "
                        "try again later"
                    )
                self._slots.wait(left)
            self._open += 1

    def release_slot(self) -> None:
        """Give a context slot back."""
        with self._slots:
            self._open = max(0, self._open - 1)
            self._slots.notify()

    @property
    def open_contexts(self) -> int:
        """Number of contexts open now."""
        with self._slots:
            return self._open

    def shutdown(self) -> None:
        """Close the browser and Playwright, stop the loop (at process exit; idempotent)."""
        loop = self._loop
        if loop is None:
            return

        async def stop() -> None:
            try:
                if self._browser is not None:
                    await self._browser.close()
            finally:
                if self._playwright is not None:
                    await self._playwright.stop()
                self._browser = self._playwright = None

        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(15)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
        loop.call_soon_threadsafe(loop.stop)
        self._loop = None


HOST = BrowserHost()
"""The process's browser host."""


class BrowserSession:
    """The browser context of one prompt: its current page, console messages and page errors.

    Use :meth:`call` to run a coroutine on the current page; :meth:`close` ends the context.
    """

    def __init__(self, settings: HermesSettings, host: BrowserHost = HOST) -> None:
        self.settings = settings
        self.host = host
        self.page: Any = None
        self.console: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self._context: Any = None
        self._closed = False
        self._dns: dict[str, str | None] = {}
        self._pages: list[Any] = []

    def open(self, wait: float) -> None:
        """Take a context slot (waiting up to ``wait`` s) and create the context and its first page.

        Raises:
            BrowserError: no free slot in time, or the browser could not start.
        """
        self.host.acquire_slot(self.settings.browser_max_contexts, wait)
        try:
            self.host.run(self._open(), self.settings.browser_timeout * 2)
        except BaseException:
            self.host.release_slot()
            raise

    async def _open(self) -> None:
        browser = await self.host._browser_for(self.settings)
        self._context = await browser.new_context(viewport={"width": 1280, "height": 800})
        self._context.set_default_timeout(self.settings.browser_timeout * 1000)
        if self.settings.web_block_private_addresses:
            await self._context.route("**/*", self._guard)
        self._context.on("page", self._adopt)
        self._adopt(await self._context.new_page())

    async def _guard(self, route: Any) -> None:
        """Abort requests to hosts that resolve to private/internal addresses."""
        host = urlsplit(route.request.url).hostname or ""
        if host and host not in self._dns:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, None)
                self._dns[host] = _non_global(host, [i[4][0] for i in infos])
            except (OSError, socket.gaierror, UnicodeError, ValueError):
                self._dns[host] = None
        if host and self._dns.get(host):
            await route.abort("blockedbyclient")
        else:
            await route.continue_()

    def _adopt(self, page: Any) -> None:
        """Make ``page`` (the first one, or a popup) current and collect its console output (once per page)."""
        self.page = page
        if any(known is page for known in self._pages):
            return
        self._pages.append(page)

        def on_console(msg: Any) -> None:
            loc = msg.location or {}
            source = f"{loc.get('url', '')}:{loc.get('lineNumber', 0)}" if loc.get("url") else ""
            self.console.append({"type": msg.type, "text": msg.text, "source": source})
            del self.console[:-MAX_LOG_ENTRIES]

        def on_error(exc: Any) -> None:
            self.errors.append({"message": getattr(exc, "message", None) or str(exc), "source": page.url})
            del self.errors[:-MAX_LOG_ENTRIES]

        page.on("console", on_console)
        page.on("pageerror", on_error)

    def call(self, fn: Callable[[Any], Awaitable[T]], timeout: float) -> T:
        """Run ``fn(page)`` on the browser loop; wait ``timeout`` s plus a margin for the loop itself.

        Raises:
            BrowserError: the session is closed, or the wait timed out.
            playwright.async_api.Error: the command failed in the browser.
        """
        if self._closed:
            raise BrowserError("the browser session is closed")

        async def current() -> T:
            return await fn(self.page)

        return self.host.run(current(), timeout + 5)

    def close(self) -> None:
        """Close the context (all its pages) and free the slot; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._context is not None:
                self.host.run(self._context.close(), 15)
        except Exception:  # noqa: BLE001 - teardown goes on (a crashed browser has nothing to close)
            pass
        finally:
            self.host.release_slot()


__all__ = [
    "CHROMIUM_ARGS",
    "HOST",
    "MAX_LOG_ENTRIES",
    "BrowserError",
    "BrowserHost",
    "BrowserSession",
    "find_chromium",
    "unavailable_reason",
]
