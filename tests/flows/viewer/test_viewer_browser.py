"""The viewer in a real browser (Playwright on Debian's Chromium): the list, a click into a trajectory,
hostile tool output shown as text that runs nothing, filters and search, the score column and its
filter with the verify output on a trajectory page, a compressed row beside its original (wide and
narrow screens). Screenshots go to
``test-artifacts/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.viewer.app import create_app
from hermes_core.mockllm import MockServer
from hermes_core.settings import HermesSettings
from hermes_core.tools.browser_session import CHROMIUM_ARGS, find_chromium
from tests.flows.viewer.compressed_run import build_compressed_run
from tests.flows.viewer.scored_run import build_scored_run
from tests.hermes_core.test_compression import tokenizer_file  # noqa: F401  (a fixture)
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


@pytest.fixture(scope="module")
def scored_base(tmp_path_factory):
    run_dir = build_scored_run(tmp_path_factory.mktemp("browser-scored"))
    with serve(create_app(run_dir)) as url:
        yield url


def scored_rows(page) -> list[tuple[str, str, str]]:
    """(prompt index, sample, score column) of every listed row, as the browser renders them."""
    cells = page.locator("table.prompts tbody tr")
    return [
        (
            row.locator("td.idx").inner_text(),
            row.locator("td.sample").inner_text(),
            row.locator("td.score").inner_text(),
        )
        for row in cells.all()
    ]


def test_the_score_column_and_its_filter(page, scored_base):
    page.goto(scored_base + "/")
    assert scored_rows(page) == [
        ("0", "0", "pass 1.00"), ("0", "1", "fail 0.00"), ("1", "0", "pass 1.00"), ("1", "1", "pass 1.00"),
        ("2", "0", "fail 0.00"), ("2", "1", "pass 1.00"), ("3", "0", "errored"), ("3", "1", "fail 0.00"),
        ("4", "0", ""), ("4", "1", ""),
    ]  # fmt: skip
    assert page.locator("table.prompts thead th").all_inner_texts()[4] == "score"
    assert page.locator("#pass-at-k").inner_text().splitlines()[:2] == ["pass@1\t0.5000", "pass@2\t1.0000"]
    page.screenshot(path=str(ARTIFACTS / "viewer-scores.png"), full_page=True)

    page.select_option("select[name=score]", "failed")
    page.get_by_role("button", name="apply").click()
    page.wait_for_url("**/?*score=failed*")
    assert [(i, s) for i, s, _ in scored_rows(page)] == [("0", "1"), ("2", "0"), ("3", "1")]
    assert page.locator("#match-count").inner_text().startswith("3 prompts match")
    assert page.locator("select[name=score]").input_value() == "failed"  # the form keeps the filter

    page.get_by_role("link", name="Make the tests pass").click()  # record 2, sample 0: its verify failed
    page.wait_for_url("**/prompt/2?score=failed")
    output = page.locator("section.scores td.explanation pre")
    assert (
        output.inner_text()
        == "exit 1: FAILED test_app.py::test_title - <b>assert</b> 'Hello' == \"Hi\"\n1 failed in 0.02s"
    )
    assert page.locator("section.scores b").count() == 0  # the markup stayed text
    page.get_by_role("link", name="prompt 3 sample 1 →").click()  # next in the filtered list
    page.wait_for_url("**/prompt/3?score=failed&sample=1")
    assert page.locator("h1").inner_text().startswith("Prompt 3 · sample 1")

    page.goto(scored_base + "/")
    page.locator("a.card.score-errored").click()
    page.wait_for_url("**/?score=errored")
    assert scored_rows(page) == [("3", "0", "errored")]
    page.select_option("select[name=score]", "passed")
    page.get_by_role("button", name="apply").click()
    assert [(i, s) for i, s, _ in scored_rows(page)] == [("0", "0"), ("1", "0"), ("1", "1"), ("2", "1")]
    assert page.dialogs == []


@pytest.fixture(scope="module")
def compressed_base(tmp_path_factory, tokenizer_file):  # noqa: F811
    with MockServer() as summariser:
        run_dir = build_compressed_run(
            tmp_path_factory.mktemp("browser-compressed"), tokenizer_file, summariser.base_url
        )
    with serve(create_app(run_dir)) as url:
        yield url


def test_a_compressed_row_beside_its_original_with_the_summary_marked(page, compressed_base):
    page.goto(compressed_base + "/")
    totals = page.locator("#compression-totals")
    assert totals.locator(".card .n").all_inner_texts() == ["2", "1", "1", "0", "0"]
    page.get_by_role("link", name="Survey the repository one file at a time").click()
    page.wait_for_url(compressed_base + "/prompt/1")
    assert "turns 4-13 summarised" in page.locator("section.compression").inner_text()
    summary = page.locator("#compressed-turn-4")
    assert summary.locator("header").inner_text() == "4 · context summary · turns 4-13 summarised"
    assert summary.locator("pre").inner_text().startswith("[CONTEXT SUMMARY]: ")
    # side by side: the summary is right of the replaced turns, level with the first of them
    first, box = page.locator("#turn-4").bounding_box(), summary.bounding_box()
    assert box["x"] > first["x"] + first["width"] and abs(box["y"] - first["y"]) < 60
    assert page.locator("#turn-13").is_visible() and page.locator("#compressed-turn-13").count() == 0
    # the summary turn has its own look (colour, border) and the replaced turns are framed
    style = summary.evaluate("e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).borderTopWidth]")
    human = page.locator("#turn-1").evaluate("e => getComputedStyle(e).backgroundColor")
    assert style[0] != human and style[1] == "2px"
    assert page.locator(".replaced").evaluate("e => getComputedStyle(e).borderTopStyle") == "dashed"
    page.screenshot(path=str(ARTIFACTS / "viewer-compressed.png"), full_page=True)
    # a narrow screen: one column, the compressed turn below the original it replaces
    page.set_viewport_size({"width": 600, "height": 900})
    first, box = page.locator("#turn-4").bounding_box(), summary.bounding_box()
    assert box["y"] > first["y"] and abs(box["x"] - first["x"]) < 30
    assert not page.locator("#compressed-turn-1").is_visible()  # unchanged turns are shown once
    assert page.dialogs == []
