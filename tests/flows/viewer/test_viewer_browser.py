"""The viewer in a real browser (Playwright on Debian's Chromium): the list, a click into a trajectory,
hostile tool output shown as text that runs nothing, filters and search. Screenshots go to
``test-artifacts/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.viewer.app import create_app
from hermes_core.settings import HermesSettings
from hermes_core.tools.browser_session import CHROMIUM_ARGS, find_chromium
from tests.live_app import serve
from tests.run_folders import XSS, build_run

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
CHROMIUM = find_chromium(HermesSettings())
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not found (apt-get install chromium)")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    run_dir = build_run(tmp_path_factory.mktemp("browser"))
    with serve(create_app(run_dir)) as url:
        yield url


@pytest.fixture()
def page(base):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.dialogs = []  # every alert/confirm/prompt the page tries to open
        page.requests = []  # every URL the page loads
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        page.on("request", lambda r: page.requests.append(r.url))
        yield page
        browser.close()


def rows(page) -> list[str]:
    return page.locator("table.prompts tbody tr td.idx").all_inner_texts()


def test_list_then_click_opens_the_trajectory_and_markup_stays_text(page, base):
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(base + "/")
    assert rows(page) == [str(i) for i in range(9)]
    assert page.get_by_role("link", name="Print the tricky markup string").is_visible()
    page.screenshot(path=str(ARTIFACTS / "viewer-run.png"), full_page=True)

    page.get_by_role("link", name="Print the tricky markup string").click()
    page.wait_for_url(base + "/prompt/1")
    assert page.locator("h1").inner_text().startswith("Prompt 1")
    # the tool's output is visible as its literal text ...
    response = page.locator("details.response pre").first
    assert XSS.replace('"', '\\"') in response.inner_text()
    # ... and nothing of it ran or loaded
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.locator("main script, main img").count() == 0
    assert page.dialogs == []
    assert all(url.startswith(base) for url in page.requests), page.requests
    # the think block and the system prompt are folded; tool calls are open
    assert page.locator("details.think").first.get_attribute("open") is None
    assert not page.locator("details.think pre").first.is_visible()
    page.locator("details.think summary").first.click()
    assert page.locator("details.think pre").first.inner_text() == f"I should run echo '{XSS}'."
    assert page.locator("details.system").get_attribute("open") is None
    page.screenshot(path=str(ARTIFACTS / "viewer-trajectory.png"), full_page=True)
    page.get_by_role("link", name="prompt 2 →").click()
    page.wait_for_url(base + "/prompt/2")
    assert "Discarded: no reasoning" in page.locator("main").inner_text()


def test_filters_and_search_in_the_form(page, base):
    page.goto(base + "/")
    page.select_option("select[name=status]", "failed")
    page.get_by_role("button", name="apply").click()
    page.wait_for_url("**/?status=failed*")
    assert rows(page) == ["4"]
    assert page.locator("#match-count").inner_text().startswith("1 prompts match")

    page.goto(base + "/")
    page.get_by_label("turn limit").check()
    page.get_by_role("button", name="apply").click()
    assert rows(page) == ["5"]

    page.goto(base + "/")
    page.fill("input[name=q]", "tricky MARKUP")
    page.press("input[name=q]", "Enter")
    page.wait_for_url("**q=tricky+MARKUP*")
    assert rows(page) == ["1"]

    page.goto(base + "/")
    page.select_option("select[name=tool]", "hallucinated_tool")
    page.get_by_role("button", name="apply").click()
    assert rows(page) == ["3"]
    page.get_by_role("link", name="reset").click()
    assert len(rows(page)) == 9
    assert page.dialogs == []
