"""A flow run of the ``default`` distribution with the mock model: every toolset is used, on real backends.

CLI subprocess -> Prefect flow (real server) -> agent -> mock model over HTTP, with
the tools on their real code paths: Chromium for the browser, a local server
speaking SearXNG's and FAL's formats for web search and image generation, the
fixture site for page extraction and images, the mock model for vision and MoA.
The dataset asks for one scenario per prompt; the test checks that every
offered toolset was used and that successes and failures are counted right.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from pytest_httpserver import HTTPServer

from hermes_core.tools import ALL_POSSIBLE_TOOLS
from tests.conftest import tool_responses
from tests.fixtures.servers import PAGES

pytestmark = pytest.mark.slow

RED = (PAGES / "red.png").read_bytes()


@pytest.fixture
def vendors(site):
    """SearXNG (search results pointing at the fixture site) and FAL (an image of the fixture site)."""
    server = HTTPServer(host="127.0.0.1", threaded=True)
    server.expect_request("/search", query_string={"q": "Search the web for hermes trajectories", "format": "json"}).respond_with_json(
        {"results": [{"url": f"{site}/article.html", "title": "Hermes trajectories explained", "content": "What a trajectory records."}]}
    )  # fmt: skip
    server.expect_request(
        "/search", query_string={"q": "Extract the text of", "format": "json"}
    ).respond_with_json({"results": []})
    server.expect_request(
        "/fal-ai/flux-2/klein/9b",
        method="POST",
        headers={"Authorization": "Key fal-demo"},
        json={"prompt": "Draw a red fox in the", "image_size": "square_hd"},
    ).respond_with_json({"images": [{"url": f"{site}/red.png", "width": 16, "height": 12}]})
    server.start()
    yield server
    server.stop()


def test_default_distribution_uses_every_toolset(cli, mock_server, site, vendors):
    prompts = {
        "browser": f"Browse the website and fill in the form [mock:url={site}/form.html]",
        "web": "Search the web for hermes trajectories and extract the best page",
        "vision": f"Describe the picture I sent [mock:image_url={site}/red.png]",
        "image_gen": "Draw a red fox in the snow",
        "moa": "Think hard about this puzzle: which weighs more, a kilo of feathers or a kilo of iron?",
        "files": "Write a tiny greeting script",
        "missing": f"Extract the text of {site}/missing.html",
    }
    dataset = cli.cwd / "default.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts.values()))
    proc = cli(
        f"--dataset_file={dataset}",
        "--batch_size=4",
        "--run_name=default_demo",
        "--model=mock/scripted",
        "--base_url",
        mock_server.base_url,
        "--distribution=default",
        "--num_workers=4",
        env={
            "HERMES_WEB_BACKEND": "searxng",
            "SEARXNG_URL": vendors.url_for("/").rstrip("/"),
            "HERMES_IMAGE_BACKEND": "fal",
            "FAL_KEY": "fal-demo",
            "HERMES_FAL_API_URL": vendors.url_for("/").rstrip("/"),
            "HERMES_WEB_BLOCK_PRIVATE_ADDRESSES": "false",
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    vendors.check_assertions()
    run = cli.cwd / "data" / "default_demo"
    rows = {
        r["prompt_index"]: r for r in map(json.loads, (run / "trajectories.jsonl").read_text().splitlines())
    }
    assert sorted(rows) == list(range(7))
    by_name = dict(zip(prompts, (rows[i] for i in range(7)), strict=True))
    for row in rows.values():
        assert sorted(row["toolsets_used"]) == [
            "browser",
            "file",
            "image_gen",
            "moa",
            "terminal",
            "vision",
            "web",
        ]
        assert row["completed"] is True and row["partial"] is False
        assert list(row["tool_stats"]) == sorted(ALL_POSSIBLE_TOOLS)

    def used(row) -> dict:
        return {t: s for t, s in row["tool_stats"].items() if s["count"]}

    ok = {"count": 1, "success": 1, "failure": 0}
    browser_tools = [t for t in ALL_POSSIBLE_TOOLS if t.startswith("browser_")]
    assert used(by_name["browser"]) == dict.fromkeys(browser_tools, ok)
    assert by_name["browser"]["api_calls"] == 9  # 8 tool turns (console, images, snapshot in one) + answer
    assert used(by_name["web"]) == {"web_search": ok, "web_extract": ok}
    assert used(by_name["vision"]) == {"vision_analyze": ok}
    assert used(by_name["image_gen"]) == {"image_generate": ok}
    assert used(by_name["moa"]) == {"mixture_of_agents": ok}
    assert used(by_name["files"]) == {"terminal": ok, "write_file": ok}
    assert used(by_name["missing"]) == {
        "web_search": ok,
        "web_extract": {"count": 1, "success": 0, "failure": 1},
    }
    assert by_name["missing"]["tool_error_counts"]["web_extract"] == 1

    def tool_results(row) -> dict:
        return {response.name: response.content for response in tool_responses(row)}

    web = tool_results(by_name["web"])
    assert web["web_search"]["data"]["web"][0]["url"] == f"{site}/article.html"
    assert web["web_extract"]["results"][0]["title"] == "Hermes trajectories explained"
    assert "END OF ARTICLE MARKER" in web["web_extract"]["results"][0]["content"]
    seen = f"image/png, {len(RED)} bytes, sha256 {hashlib.sha256(RED).hexdigest()[:16]}"
    assert tool_results(by_name["vision"])["vision_analyze"]["analysis"].endswith(seen + ".")
    assert tool_results(by_name["image_gen"])["image_generate"]["image"] == f"{site}/red.png"
    browsed = tool_results(by_name["browser"])
    assert 'heading "Hello, Browse the website and fill in!"' in browsed["browser_snapshot"]["snapshot"]
    assert browsed["browser_back"]["url"] == f"{site}/form.html"
    assert browsed["browser_vision"]["success"] is True
    assert tool_results(by_name["missing"])["web_extract"]["error"].startswith(
        f"Content was inaccessible or not found ({site}/missing.html: HTTP 404"
    )

    stats = json.loads((run / "statistics.json").read_text())["tool_statistics"]
    assert stats["web_extract"] == {
        "count": 2, "success": 1, "failure": 1, "success_rate": 50.0, "failure_rate": 50.0
    }  # fmt: skip
    assert all(
        stats[t]["count"] >= 1
        for t in ALL_POSSIBLE_TOOLS
        if t not in ("process", "read_file", "patch", "search_files")
    )
