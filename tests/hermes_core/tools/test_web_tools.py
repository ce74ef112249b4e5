"""web_search / web_extract against local servers speaking Firecrawl's, Tavily's and SearXNG's formats.

The vendor APIs are unreachable here, so each backend runs against a real HTTP
server on 127.0.0.1 (pytest-httpserver) that checks the request we send (path,
method, headers, JSON body) and answers in the vendor's documented format,
including its errors. Direct page fetches go to the fixture site.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from werkzeug import Response

from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, ToolContext, offered_tools
from tests.fixtures.servers import PAGES, static_site

NO_BACKEND = {
    "firecrawl_api_key": None,
    "firecrawl_api_url": None,
    "tavily_api_key": None,
    "searxng_url": None,
}


def call(env, name: str, args: dict, **settings) -> dict:
    """Run tool ``name`` through the registry (validation, JSON) with these settings."""
    ctx = ToolContext(env=env, settings=HermesSettings(**{**NO_BACKEND, **settings}))
    return json.loads(REGISTRY[name].invoke(ctx, args))


def firecrawl(api) -> dict:
    return {"firecrawl_api_key": "fc-test", "firecrawl_api_url": api.url_for("/").rstrip("/")}


def test_availability_follows_the_configured_backend():
    _, missing = offered_tools(["web"], HermesSettings(**NO_BACKEND))
    assert set(missing) == {"web_search", "web_extract"}
    assert missing["web_search"].startswith("no web backend configured")
    tools, missing = offered_tools(["web"], HermesSettings(**{**NO_BACKEND, "searxng_url": "http://s"}))
    assert [t.name for t in tools] == ["web_search", "web_extract"] and missing == {}
    _, missing = offered_tools(
        ["web"], HermesSettings(**{**NO_BACKEND, "searxng_url": "http://s", "web_backend": "tavily"})
    )
    assert missing["web_search"] == "web backend 'tavily' chosen but not configured (key or URL missing)"


# ----------------------------------------------------------------------------- Firecrawl


def test_firecrawl_search_request_and_ranked_results(api, env):
    web = [
        {"url": f"https://site{i}.example/", "title": f"Site {i}", "description": f"About {i}", "position": i}
        for i in range(1, 5)
    ]
    api.expect_request(
        "/v2/search",
        method="POST",
        headers={"Authorization": "Bearer fc-test"},
        json={"query": "hermes agent", "limit": 3},
    ).respond_with_json({"success": True, "data": {"web": web, "images": []}})
    result = call(env, "web_search", {"query": "hermes agent", "limit": 3}, **firecrawl(api))
    assert result == {
        "success": True,
        "data": {
            "web": [
                {
                    "title": f"Site {i}",
                    "url": f"https://site{i}.example/",
                    "description": f"About {i}",
                    "position": i,
                }
                for i in range(1, 4)
            ]
        },
    }


def test_firecrawl_401_is_an_error_with_the_vendor_message_and_no_retry(api, env):
    api.expect_request("/v2/search").respond_with_json(
        {"success": False, "error": "Unauthorized: Invalid token"}, status=401
    )
    result = call(env, "web_search", {"query": "x"}, **firecrawl(api))
    assert result == {"error": "Error searching web: HTTP 401: Unauthorized: Invalid token"}
    assert len(api.log) == 1


def test_firecrawl_429_honours_retry_after_then_succeeds(api, env):
    api.expect_ordered_request("/v2/search").respond_with_json(
        {"success": False, "error": "Rate limit exceeded"}, status=429, headers={"Retry-After": "1"}
    )
    api.expect_ordered_request("/v2/search").respond_with_json(
        {"success": True, "data": {"web": [{"url": "https://a.example/", "title": "A", "description": "d"}]}}
    )
    started = time.monotonic()
    result = call(env, "web_search", {"query": "x"}, **firecrawl(api))
    assert time.monotonic() - started >= 0.95
    assert result["data"]["web"] == [
        {"title": "A", "url": "https://a.example/", "description": "d", "position": 1}
    ]
    assert len(api.log) == 2


def test_firecrawl_5xx_is_retried_a_bounded_number_of_times(api, env):
    api.expect_request("/v2/search").respond_with_json(
        {"success": False, "error": "upstream down"}, status=502
    )
    result = call(env, "web_search", {"query": "x"}, web_max_retries=1, **firecrawl(api))
    assert result == {"error": "Error searching web: HTTP 502: upstream down"}
    assert len(api.log) == 2


def test_a_vendor_that_hangs_times_out(api, env):
    def slow(request):
        time.sleep(1.5)
        return Response("{}", content_type="application/json")

    api.expect_request("/v2/search").respond_with_handler(slow)
    started = time.monotonic()
    result = call(env, "web_search", {"query": "x"}, web_timeout=0.4, web_max_retries=0, **firecrawl(api))
    assert result == {"error": "Error searching web: timed out after 0.4 s"}
    assert time.monotonic() - started < 1.4


def test_firecrawl_scrape_request_window_and_inline_images(api, env):
    long_text = "# Big page\n\n![logo](data:image/png;base64,iVBORw0KGgo=)\n\n" + "".join(
        f"line {i:05d} of the page\n" for i in range(2000)
    )
    api.expect_request(
        "/v2/scrape",
        method="POST",
        headers={"Authorization": "Bearer fc-test"},
        json={"url": "https://docs.example/big", "formats": ["markdown"], "onlyMainContent": True},
    ).respond_with_json(
        {
            "success": True,
            "data": {"markdown": long_text, "metadata": {"title": "Big page", "statusCode": 200}},
        }
    )
    result = call(
        env, "web_extract", {"urls": ["https://docs.example/big"], "char_limit": 3000}, **firecrawl(api)
    )
    (page,) = result["results"]
    assert page["url"] == "https://docs.example/big" and page["title"] == "Big page" and page["error"] is None
    assert "data:image" not in page["content"] and "![logo]" not in page["content"]
    assert len(page["content"]) <= 3000
    assert page["content"].startswith("# Big page\n\n\n\nline 00000 of the page")
    assert page["content"].endswith("line 01999 of the page")
    saved = page["content"].split("is saved at ")[1].split(":")[0]
    full = (Path(env.cwd) / saved).read_text()
    assert saved.startswith(".hermes/web/") and full.count("of the page") == 2000 and "data:image" not in full


def test_firecrawl_failed_pages_and_nothing_extracted(api, env):
    api.expect_request("/v2/scrape", json={"url": "https://gone.example/", "formats": ["markdown"], "onlyMainContent": True}).respond_with_json(
        {"success": True, "data": {"markdown": "", "metadata": {"statusCode": 404, "error": "Not Found"}}}
    )  # fmt: skip
    api.expect_request("/v2/scrape", json={"url": "https://ok.example/", "formats": ["markdown"], "onlyMainContent": True}).respond_with_json(
        {"success": True, "data": {"markdown": "Short page.", "metadata": {"title": "OK"}}}
    )  # fmt: skip
    both = call(
        env, "web_extract", {"urls": ["https://gone.example/", "https://ok.example/"]}, **firecrawl(api)
    )
    assert both == {
        "results": [
            {"url": "https://gone.example/", "title": "", "content": "", "error": "Not Found"},
            {"url": "https://ok.example/", "title": "OK", "content": "Short page.", "error": None},
        ]
    }
    none = call(env, "web_extract", {"urls": ["https://gone.example/"]}, **firecrawl(api))
    assert none == {"error": "Content was inaccessible or not found (https://gone.example/: Not Found)"}


def test_private_addresses_are_blocked_per_url_by_default(api, env):
    api.expect_request("/v2/scrape").respond_with_json(
        {"success": True, "data": {"markdown": "Public page.", "metadata": {"title": "Public"}}}
    )
    result = call(
        env,
        "web_extract",
        {"urls": ["http://127.0.0.1:9/secret", "http://93.184.215.14/page", "http://169.254.169.254/latest"]},
        **firecrawl(api),
    )
    assert result["blocked_by_policy"] is True
    errors = [r["error"] for r in result["results"]]
    assert errors == [
        "Blocked: 127.0.0.1 resolves to the private/internal address 127.0.0.1",
        None,
        "Blocked: 169.254.169.254 resolves to the private/internal address 169.254.169.254",
    ]
    assert result["results"][1]["content"] == "Public page."
    assert [json.loads(req.data)["url"] for req, _ in api.log] == ["http://93.184.215.14/page"]


# ----------------------------------------------------------------------------- Tavily


def tavily(api) -> dict:
    return {"tavily_api_key": "tvly-test", "tavily_api_url": api.url_for("/").rstrip("/")}


def test_tavily_search_and_extract_formats(api, env):
    api.expect_request(
        "/search",
        method="POST",
        headers={"Authorization": "Bearer tvly-test"},
        json={"query": "prefect flows", "max_results": 2, "search_depth": "basic"},
    ).respond_with_json(
        {
            "query": "prefect flows",
            "results": [
                {
                    "title": "Flows",
                    "url": "https://docs.prefect.io/flows",
                    "content": "Flows are...",
                    "score": 0.9,
                },
                {
                    "title": "Tasks",
                    "url": "https://docs.prefect.io/tasks",
                    "content": "Tasks are...",
                    "score": 0.8,
                },
            ],
            "response_time": 1.2,
        }
    )
    found = call(env, "web_search", {"query": "prefect flows", "limit": 2}, **tavily(api))
    assert found["data"]["web"][1] == {
        "title": "Tasks",
        "url": "https://docs.prefect.io/tasks",
        "description": "Tasks are...",
        "position": 2,
    }
    api.expect_request(
        "/extract",
        method="POST",
        json={
            "urls": ["https://a.example/", "https://b.example/"],
            "format": "markdown",
            "extract_depth": "basic",
        },
    ).respond_with_json(
        {
            "results": [{"url": "https://a.example/", "raw_content": "# Page A\n\nBody of A."}],
            "failed_results": [{"url": "https://b.example/", "error": "Failed to fetch url"}],
            "response_time": 0.5,
        }
    )
    pages = call(env, "web_extract", {"urls": ["https://a.example/", "https://b.example/"]}, **tavily(api))
    assert pages == {
        "results": [
            {
                "url": "https://a.example/",
                "title": "Page A",
                "content": "# Page A\n\nBody of A.",
                "error": None,
            },
            {"url": "https://b.example/", "title": "", "content": "", "error": "Failed to fetch url"},
        ]
    }


def test_tavily_whole_call_error_keeps_the_vendor_message(api, env):
    api.expect_request("/extract").respond_with_json(
        {"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401
    )
    result = call(env, "web_extract", {"urls": ["https://a.example/"]}, **tavily(api))
    assert result == {
        "error": "Error extracting content: HTTP 401: Unauthorized: missing or invalid API key."
    }


# ----------------------------------------------------------------------------- SearXNG + direct fetch


def searxng(api) -> dict:
    return {"searxng_url": api.url_for("/").rstrip("/"), "web_block_private_addresses": False}


def test_searxng_search_format(api, env):
    api.expect_request("/search", method="GET", query_string={"q": "hermes", "format": "json"}).respond_with_json(
        {
            "query": "hermes",
            "number_of_results": 0,
            "results": [
                {"url": "https://en.wikipedia.org/wiki/Hermes", "title": "Hermes", "content": "Greek god", "engine": "wikipedia"},
                {"url": "https://hermes.example/", "title": "", "content": None, "engine": "duckduckgo"},
            ],
        }
    )  # fmt: skip
    result = call(env, "web_search", {"query": "hermes"}, **searxng(api))
    assert result["data"]["web"] == [
        {
            "title": "Hermes",
            "url": "https://en.wikipedia.org/wiki/Hermes",
            "description": "Greek god",
            "position": 1,
        },
        {"title": "", "url": "https://hermes.example/", "description": "", "position": 2},
    ]


def test_searxng_without_json_format_reports_403(api, env):
    api.expect_request("/search").respond_with_data("Forbidden", status=403, content_type="text/html")
    result = call(env, "web_search", {"query": "hermes"}, **searxng(api))
    assert result == {"error": "Error searching web: HTTP 403: Forbidden"}


def test_direct_fetch_turns_html_into_markdown(api, site, env):
    result = call(env, "web_extract", {"urls": [f"{site}/article.html"]}, **searxng(api))
    (page,) = result["results"]
    assert page["title"] == "Hermes trajectories explained" and page["error"] is None
    content = page["content"]
    assert content.startswith("# Hermes trajectories explained")
    assert "[tool calls](https://example.org/tools)" in content
    assert "| completed | the agent finished |" in content
    assert "Paragraph 40 of the article" in content and content.rstrip().endswith("END OF ARTICLE MARKER")
    assert "Copyright fixture site" not in content  # boilerplate (footer) dropped


def test_direct_fetch_errors_per_url(api, site, env, tmp_path):
    big = tmp_path / "big.html"
    big.write_text("<html><body>" + "<p>filler text</p>" * 5000 + "</body></html>")
    with static_site(tmp_path) as other:
        result = call(
            env,
            "web_extract",
            {"urls": [f"{site}/missing.html", f"{site}/red.png", f"{other}/big.html", f"{site}/index.html"]},
            web_max_bytes=20_000,
            **searxng(api),
        )
    errors = [r["error"] for r in result["results"]]
    assert errors[0].startswith("HTTP 404: ")
    assert errors[1] == "unsupported content type 'image/png'"
    assert errors[2] == f"response too large: {big.stat().st_size} bytes (limit 20000)"
    assert errors[3] is None and result["results"][3]["title"] == "Fixture home"
    assert (PAGES / "red.png").exists()


def test_direct_fetch_blocks_loopback_when_the_guard_is_on(api, site, env):
    result = call(
        env,
        "web_extract",
        {"urls": [f"{site}/index.html"]},
        **{**searxng(api), "web_block_private_addresses": True},
    )
    assert result == {
        "error": (
            f"Content was inaccessible or not found ({site}/index.html: "
            "Blocked: 127.0.0.1 resolves to the private/internal address 127.0.0.1)"
        )
    }


def test_more_than_five_urls_is_an_argument_error(env):
    result = call(
        env, "web_extract", {"urls": [f"https://x{i}.example/" for i in range(6)]}, searxng_url="http://s"
    )
    assert result["error"].startswith("Invalid arguments for web_extract: urls:")
