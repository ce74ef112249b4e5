"""The tool registry: one declaration per tool, schemas as the reference, availability, arguments validation."""

from __future__ import annotations

import json

import pytest

from hermes_core.environments import create_environment
from hermes_core.settings import HermesSettings
from hermes_core.tools import ALL_POSSIBLE_TOOLS, REGISTRY, TOOLSETS, ToolContext, offered_tools

REFERENCE = {  # tool -> (toolset, required params, all params), the reference tools, revisions as docs/toolsets.md
    "terminal": ("terminal", ["command"], {"command", "background", "timeout", "workdir"}),
    "process": ("terminal", ["action"], {"action", "session_id", "data", "timeout", "offset", "limit"}),
    "read_file": ("file", ["path"], {"path", "offset", "limit"}),
    "write_file": ("file", ["path", "content"], {"path", "content"}),
    "patch": ("file", [], {"mode", "path", "old_string", "new_string", "replace_all", "patch"}),
    "search_files": (
        "file",
        ["pattern"],
        {"pattern", "target", "path", "file_glob", "limit", "offset", "output_mode", "context"},
    ),
    "web_search": ("web", ["query"], {"query", "limit"}),
    "web_extract": ("web", ["urls"], {"urls", "char_limit"}),
    "vision_analyze": ("vision", ["image_url", "question"], {"image_url", "question"}),
    "image_generate": ("image_gen", ["prompt"], {"prompt", "aspect_ratio"}),
    "mixture_of_agents": ("moa", ["user_prompt"], {"user_prompt"}),
    "browser_navigate": ("browser", ["url"], {"url"}),
    "browser_snapshot": ("browser", [], {"full"}),
    "browser_click": ("browser", ["ref"], {"ref"}),
    "browser_type": ("browser", ["ref", "text"], {"ref", "text"}),
    "browser_scroll": ("browser", ["direction"], {"direction"}),
    "browser_back": ("browser", [], set()),
    "browser_press": ("browser", ["key"], {"key"}),
    "browser_get_images": ("browser", [], set()),
    "browser_vision": ("browser", ["question"], {"question"}),
    "browser_console": ("browser", [], {"clear"}),
}


def test_registry_has_the_reference_tools_with_their_parameters():
    assert ALL_POSSIBLE_TOOLS == tuple(sorted(REFERENCE))
    for name, (toolset, required, params) in REFERENCE.items():
        schema = REGISTRY[name].schema()
        assert schema["type"] == "function" and schema["function"]["name"] == name
        parameters = schema["function"]["parameters"]
        assert parameters["type"] == "object"
        assert set(parameters["properties"]) == params, name
        assert sorted(parameters["required"]) == sorted(required), name
        assert REGISTRY[name].toolset == toolset
        assert schema["function"]["description"]
        for prop in parameters["properties"].values():
            assert "title" not in prop and prop.get("description"), name
    assert {ts: set(names) for ts, names in TOOLSETS.items()} == {
        ts: {n for n, (t, _, _) in REFERENCE.items() if t == ts}
        for ts in {t for t, _, _ in REFERENCE.values()}
    }


def test_json_types_and_enums_follow_the_reference():
    props = lambda name: REGISTRY[name].schema()["function"]["parameters"]["properties"]  # noqa: E731
    assert props("terminal")["timeout"] == {
        "type": "integer",
        "minimum": 1,
        "description": props("terminal")["timeout"]["description"],
    }
    assert props("terminal")["background"]["type"] == "boolean"
    assert props("process")["action"]["enum"] == [
        "list",
        "poll",
        "log",
        "wait",
        "kill",
        "write",
        "submit",
        "close",
    ]
    assert props("patch")["mode"]["enum"] == ["replace", "patch"]
    assert props("search_files")["target"]["enum"] == ["content", "files"]
    assert props("search_files")["output_mode"]["enum"] == ["content", "files_only", "count"]
    assert props("web_extract")["urls"] == {
        "type": "array", "items": {"type": "string"}, "maxItems": 5, "description": props("web_extract")["urls"]["description"]
    }  # fmt: skip
    assert props("read_file")["limit"]["maximum"] == 2000
    assert props("browser_scroll")["direction"]["enum"] == ["up", "down"]


def test_only_configured_toolsets_are_offered():
    settings = HermesSettings(browser_executable_path="/nonexistent/chromium")
    tools, unavailable = offered_tools(["terminal", "file", "web", "browser"], settings)
    assert [t.name for t in tools] == [
        "terminal",
        "process",
        "read_file",
        "write_file",
        "patch",
        "search_files",
    ]
    assert set(unavailable) == {
        "web_search",
        "web_extract",
        *(n for n in REFERENCE if n.startswith("browser_")),
    }
    assert unavailable["web_search"].startswith("no web backend configured: set FIRECRAWL_API_KEY")
    assert unavailable["browser_click"].startswith("Chromium not found (/nonexistent/chromium)")


def test_invalid_arguments_become_an_error_result_naming_the_field():
    with create_environment("local") as env:
        ctx = ToolContext(env=env, settings=HermesSettings())
        result = json.loads(REGISTRY["terminal"].invoke(ctx, {"timeout": "soon"}))
        assert "command" in result["error"] and "timeout" in result["error"]
        ok = json.loads(REGISTRY["terminal"].invoke(ctx, {"command": "echo hi"}))
        assert ok == {"output": "hi", "exit_code": 0, "error": None}


def test_unknown_toolset_is_a_config_error():
    from hermes_core.exceptions import ConfigError
    from hermes_core.settings import HermesSettings
    from hermes_core.tools import offered_tools

    with pytest.raises(ConfigError, match="unknown toolset 'nope'"):
        offered_tools(["terminal", "nope"], HermesSettings())
