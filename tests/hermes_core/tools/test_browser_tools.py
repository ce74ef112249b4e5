"""The browser_* tools for real: Playwright driving the system Chromium against pages on 127.0.0.1.

Needs Chromium at /usr/bin/chromium (``.ci/run`` installs Debian's package when missing).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time

import pytest

from hermes_core.environments import create_environment
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, TOOLSETS, ModelEndpoint, ToolContext, offered_tools
from hermes_core.tools.browser import compact_snapshot
from hermes_core.tools.browser_session import HOST

LOCAL = {"web_block_private_addresses": False}


class Prompt:
    """One prompt's tool context; ``close()`` is the prompt's teardown."""

    def __init__(self, env, endpoint=None, **settings):
        self.ctx = ToolContext(
            env=env, settings=HermesSettings(**{**LOCAL, **settings}), model_endpoint=endpoint
        )

    def __call__(self, name: str, **args) -> dict:
        return json.loads(REGISTRY[name].invoke(self.ctx, args))

    def eval(self, expression: str):
        session = self.ctx.state["browser"]
        return session.call(lambda page: page.evaluate(expression), 10)

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture
def prompt():
    with create_environment("local") as env:
        p = Prompt(env)
        yield p
        p.close()


def ref(snapshot: str, role: str, name: str) -> str:
    match = re.search(rf'- {role} "{re.escape(name)}"[^\n]*\[ref=((?:f\d+)?e\d+)\]', snapshot)
    assert match, snapshot
    return "@" + match.group(1)


def test_offered_when_chromium_is_found():
    tools, missing = offered_tools(["browser"], HermesSettings())
    assert [t.name for t in tools] == list(TOOLSETS["browser"]) and len(tools) == 10 and missing == {}


def test_form_flow_navigate_type_click_snapshot_back(prompt, site):
    opened = prompt("browser_navigate", url=f"{site}/form.html")
    assert opened["success"] and opened["url"] == f"{site}/form.html" and opened["title"] == "Contact form"
    assert opened["element_count"] == 5
    snap = opened["snapshot"]
    typed = prompt("browser_type", ref=ref(snap, "textbox", "Name"), text="Ada Lovelace")
    assert typed == {"success": True, "typed": "Ada Lovelace", "element": ref(snap, "textbox", "Name")}
    assert prompt.eval("document.querySelector('input[name=name]').value") == "Ada Lovelace"
    clicked = prompt("browser_click", ref=ref(snap, "button", "Send"))
    assert clicked == {"success": True, "clicked": ref(snap, "button", "Send")}
    after = prompt("browser_snapshot", full=True)
    assert after["success"] and 'heading "Hello, Ada Lovelace!" [level=1]' in after["snapshot"]
    assert prompt.eval("location.search") == "?name=Ada+Lovelace&colour=red"
    back = prompt("browser_back")
    assert back == {"success": True, "url": f"{site}/form.html"}
    stale = prompt("browser_click", ref="@e99999")
    assert stale == {
        "success": False,
        "error": "element @e99999 not found on the page: take a new browser_snapshot",
    }


def test_press_enter_submits_and_refs_without_at_work(prompt, site):
    snap = prompt("browser_navigate", url=f"{site}/form.html")["snapshot"]
    box = ref(snap, "textbox", "Name").lstrip("@")
    assert prompt("browser_type", ref=box, text="Grace")["success"]
    assert prompt("browser_press", key="Enter") == {"success": True, "pressed": "Enter"}
    assert 'heading "Hello, Grace!"' in prompt("browser_snapshot")["snapshot"]
    assert prompt("browser_press", key="NoSuchKey") == {
        "success": False,
        "error": 'Keyboard.press: Unknown key: "NoSuchKey"',
    }
    assert prompt("browser_type", ref="#name", text="x")["error"].startswith(
        "invalid element reference '#name'"
    )


def test_compact_and_full_snapshots(prompt, site):
    prompt("browser_navigate", url=f"{site}/index.html")
    compact = prompt("browser_snapshot")
    full = prompt("browser_snapshot", full=True)
    links = ["Home", "Open the form", "Read the article", "See the images", "Console page"]
    assert [line.split('"')[1] for line in compact["snapshot"].splitlines()] == [
        "Home",
        "Fixture home",
        *links[1:],
    ]
    assert compact["element_count"] == 6 and "paragraph" not in compact["snapshot"]
    assert "- paragraph" in full["snapshot"] and full["element_count"] > compact["element_count"]
    assert compact_snapshot(full["snapshot"]) == compact["snapshot"]


def test_console_messages_errors_and_clear(prompt, site):
    prompt("browser_navigate", url=f"{site}/console.html")
    time.sleep(0.3)  # the page throws from a timer
    snap = prompt("browser_snapshot")["snapshot"]
    prompt("browser_click", ref=ref(snap, "button", "Log something"))
    console = prompt("browser_console", clear=True)
    assert [(m["type"], m["text"]) for m in console["console_messages"]] == [
        ("log", "hello from the console page"),
        ("warning", "this is a warning"),
        ("log", "button clicked"),
    ]
    assert console["console_messages"][0]["source"].startswith(f"{site}/console.html:")
    assert console["js_errors"] == [{"message": "boom from a timer", "source": f"{site}/console.html"}]
    assert (console["total_messages"], console["total_errors"]) == (3, 1)
    assert prompt("browser_console") == {
        "success": True,
        "console_messages": [],
        "js_errors": [],
        "total_messages": 0,
        "total_errors": 0,
    }


def test_images_and_scroll(prompt, site):
    prompt("browser_navigate", url=f"{site}/images.html")
    images = prompt("browser_get_images")
    assert images == {
        "success": True,
        "images": [
            {"src": f"{site}/red.png", "alt": "a red rectangle", "width": 16, "height": 12},
            {"src": f"{site}/blue.png", "alt": "a blue square", "width": 4, "height": 4},
        ],
        "count": 2,
    }
    assert prompt.eval("window.scrollY") == 0
    assert prompt("browser_scroll", direction="down") == {"success": True, "scrolled": "down"}
    assert prompt.eval("window.scrollY") == 640  # 0.8 x the 800-pixel viewport
    prompt("browser_scroll", direction="up")
    assert prompt.eval("window.scrollY") == 0


def test_browser_vision_screenshot_goes_to_the_vision_model(mock_server, site):
    with create_environment("local") as env:
        p = Prompt(env, ModelEndpoint(base_url=mock_server.base_url, api_key=None, model="mock/scripted"))
        try:
            p("browser_navigate", url=f"{site}/images.html")
            result = p("browser_vision", question="Which colours are shown?")
            path = result["screenshot_path"]
            assert path == f"{env.cwd}/.hermes/browser/screenshot_001.png"
            png = env.read_file(path)
            assert png.startswith(b"\x89PNG")
            digest = hashlib.sha256(png).hexdigest()[:16]
            assert result["success"] is True
            assert result["analysis"].endswith(f"image/png, {len(png)} bytes, sha256 {digest}.")
        finally:
            p.close()


def test_navigation_policy(prompt, site):
    assert prompt("browser_navigate", url="file:///etc/passwd") == {
        "success": False,
        "error": "only http and https URLs can be opened (got 'file')",
    }
    assert prompt("browser_navigate", url="http://169.254.169.254/latest/meta-data/")["error"] == (
        "Blocked: 169.254.169.254 is a cloud metadata address"
    )
    assert prompt("browser_navigate", url=f"{site}/x?api_key=abcdef0123456789")["error"] == (
        "Blocked: the URL looks like it contains an API key or secret"
    )
    prompt.ctx.settings = HermesSettings(web_block_private_addresses=True)
    assert prompt("browser_navigate", url=f"{site}/index.html")["error"] == (
        "Blocked: 127.0.0.1 resolves to the private/internal address 127.0.0.1"
    )
    assert "browser" not in prompt.ctx.state  # refused before any browser context was opened


@pytest.mark.parametrize(("guard", "outcome"), [(True, "blocked"), (False, "ok 0")])
def test_guard_blocks_requests_to_private_addresses(site, guard, outcome):
    """With the guard on, every request of the context to loopback is aborted, not only navigations."""
    from hermes_core.tools.browser import prompt_session

    with create_environment("local") as env:
        p = Prompt(env, web_block_private_addresses=guard)
        try:
            fetch = (
                f"fetch('{site}/index.html', {{mode: 'no-cors'}}).then(r => 'ok ' + r.status, e => 'blocked')"
            )
            assert prompt_session(p.ctx).call(lambda page: page.evaluate(fetch), 10) == outcome
        finally:
            p.close()


def test_back_without_history_and_unreachable_page(prompt):
    assert prompt("browser_back") == {
        "success": False,
        "error": "there is no previous page in this tab's history",
    }
    down = prompt("browser_navigate", url="http://127.0.0.1:9/")
    assert down["success"] is False and "ERR_" in down["error"]


def test_contexts_are_bounded_closed_at_teardown_and_isolated(site):
    assert HOST.open_contexts == 0
    with create_environment("local") as env_a, create_environment("local") as env_b:
        # a: a timeout that a busy machine's Chromium start fits in; b: 1 s, whose wait for a free
        # context (twice browser_timeout) is what this test times
        a = Prompt(env_a, browser_max_contexts=1, browser_timeout=30)
        b = Prompt(env_b, browser_max_contexts=1, browser_timeout=1)
        assert a("browser_navigate", url=f"{site}/form.html")["success"]
        assert HOST.open_contexts == 1
        started = time.monotonic()
        refused = b("browser_navigate", url=f"{site}/form.html")
        assert refused["error"].startswith("all 1 browser contexts of this process are in use")
        assert 1.5 < time.monotonic() - started < 5
        a.close()
        assert HOST.open_contexts == 0
        assert a("browser_snapshot") == {"success": False, "error": "the browser session is closed"}
        b.close()
        c = Prompt(env_b, browser_max_contexts=1, browser_timeout=30)  # the freed context is reusable
        assert c("browser_navigate", url=f"{site}/form.html")["success"]
        c.close()
    assert HOST.open_contexts == 0


def test_prompts_in_threads_get_their_own_contexts(site):
    names = [f"Person {i}" for i in range(4)]
    seen: dict[str, str] = {}

    def one(name: str) -> None:
        with create_environment("local") as env:
            p = Prompt(env)
            try:
                snap = p("browser_navigate", url=f"{site}/form.html")["snapshot"]
                p("browser_type", ref=ref(snap, "textbox", "Name"), text=name)
                time.sleep(0.2)
                seen[name] = p.eval("document.querySelector('input[name=name]').value")
            finally:
                p.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == {n: n for n in names}
    assert HOST.open_contexts == 0
