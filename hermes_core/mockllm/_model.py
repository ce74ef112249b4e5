"""The deterministic "model" of the mock server: from a Chat Completions request to a response body.

Everything here is a pure function of the request, the options and the
conversation's request counter; the only other input is ``time.time()`` in
``created``. Tool choice follows a scenario when the prompt asks for one and
its tools are offered (browse a page and click through it, search the web and
extract a page, analyse an image, generate an image, ask a mixture of agents;
URLs come from the prompt or the ``url`` / ``image_url`` options), else a fixed
plan over the offered tools (terminal command, write a file, read it back,
search), falling back to arguments generated from the offered tool's JSON schema.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hermes_core.mockllm._options import MockOptions, strip_directives

UNKNOWN_TOOL_NAME = "hallucinated_tool"
SOLUTION_PATH = "solution.py"


def message_text(content: Any) -> str:
    """Text of a message ``content``: a string, or the ``text`` of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return "" if content is None else str(content)


def first_user_content(messages: list[Any]) -> Any:
    """``content`` of the first ``user`` message, or ``""`` when there is none."""
    for msg in messages:
        if isinstance(msg, dict) and msg.get("role") == "user":
            return msg.get("content", "")
    return ""


def conversation_key(messages: list[Any]) -> str:
    """First 16 hex chars of the sha256 of the first user message content (JSON of it when not a string)."""
    content = first_user_content(messages)
    raw = content if isinstance(content, str) else json.dumps(content, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def assistant_turns(messages: list[Any]) -> int:
    """Number of assistant messages in ``messages``: the 0-based turn number of the next answer."""
    return sum(1 for msg in messages if isinstance(msg, dict) and msg.get("role") == "assistant")


def unit_hash(seed: int, key: str, salt: str) -> float:
    """A seeded, deterministic number in [0, 1) for conversation ``key``."""
    digest = hashlib.sha256(f"{salt}:{seed}:{key}".encode()).hexdigest()
    return int(digest[:16], 16) / 2**64


def prompt_words(text: str, limit: int = 6) -> str:
    """A few alphanumeric words of the prompt (directives removed): safe inside a double-quoted shell string."""
    words = re.findall(r"[A-Za-z0-9]+", strip_directives(text))
    return " ".join(words[:limit]) or "hello"


@dataclass(frozen=True)
class Turn:
    """What the request says about the conversation so far."""

    words: str
    turn: int
    tool_results: int
    last_tool_result: str | None


def read_turn(messages: list[Any]) -> Turn:
    """Summarise the request's ``messages`` for answering it."""
    last = None
    count = 0
    for msg in messages:
        if isinstance(msg, dict) and msg.get("role") == "tool":
            count += 1
            last = message_text(msg.get("content"))
    return Turn(
        words=prompt_words(message_text(first_user_content(messages))),
        turn=assistant_turns(messages),
        tool_results=count,
        last_tool_result=last,
    )


# ----------------------------------------------------------------------------- tool arguments


def _slug(words: str) -> str:
    return "-".join(words.lower().split()) or "page"


def _string_for(name: str, words: str) -> str:
    lname = name.lower()
    if "url" in lname:
        return f"https://example.com/{_slug(words)}"
    if lname in ("path", "file_path", "filename", "file"):
        return SOLUTION_PATH
    if lname in ("workdir", "directory", "dir", "cwd"):
        return "."
    if lname == "command":
        return f'echo "{words}"'
    if lname == "ref":
        return "@e1"
    if lname == "key":
        return "Enter"
    if lname == "session_id":
        return "proc_000000000000"
    if lname in ("pattern", "regex", "glob"):
        return words.split()[0]
    return words


def schema_value(name: str, schema: dict[str, Any], words: str, depth: int = 0) -> Any:
    """A sensible value for the parameter ``name`` of JSON schema ``schema``."""
    if not isinstance(schema, dict):
        return words
    if schema.get("enum"):
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for combo in ("anyOf", "oneOf", "allOf"):
        if schema.get(combo):
            return schema_value(name, schema[combo][0], words, depth)
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "string":
        return _string_for(name, words)
    if kind in ("integer", "number"):
        value = schema.get("minimum", 1)
        if "maximum" in schema:
            value = min(value, schema["maximum"])
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind == "array":
        singular = name[:-1] if name.endswith("s") else name
        count = max(1, int(schema.get("minItems", 1)))
        return [schema_value(singular, schema.get("items", {}), words, depth + 1) for _ in range(count)]
    if kind == "object":
        return schema_arguments(schema, words, depth + 1) if depth < 4 else {}
    return None


def schema_arguments(parameters: dict[str, Any], words: str, depth: int = 0) -> dict[str, Any]:
    """Arguments for a tool with JSON-schema ``parameters``: a value for every required property."""
    props = parameters.get("properties") or {}
    required = parameters.get("required") or []
    return {name: schema_value(name, props.get(name, {}), words, depth) for name in required}


def _solution_source(words: str) -> str:
    return f'words = "{words}"\nprint(words.upper())\nprint(len(words.split()), "words")\n'


def _planned(step: int, offered: dict[str, dict[str, Any]], words: str) -> tuple[str, dict[str, Any]] | None:
    """The plan's call for ``step`` among the terminal/file tools offered, or None."""
    phase = step % 4
    candidates: list[tuple[str, dict[str, Any]]] = []
    if phase == 0:
        candidates = [
            ("terminal", {"command": f'ls -la && echo "{words}"'}),
            ("write_file", {"path": SOLUTION_PATH, "content": _solution_source(words)}),
        ]
    elif phase == 1:
        candidates = [
            ("write_file", {"path": SOLUTION_PATH, "content": _solution_source(words)}),
            ("terminal", {"command": 'python3 -c "print(6*7)"'}),
        ]
    elif phase == 2:
        if "write_file" in offered:
            candidates.append(("read_file", {"path": SOLUTION_PATH}))
        candidates.append(("terminal", {"command": "uname -a"}))
    else:
        candidates = [
            ("search_files", {"pattern": "print", "path": "."}),
            ("terminal", {"command": "pwd && ls"}),
        ]
    for name, args in candidates:
        if name in offered:
            return name, {**schema_arguments(offered[name], words), **args}
    return None


def plan_call(step: int, offered: dict[str, dict[str, Any]], words: str) -> tuple[str, dict[str, Any]]:
    """Tool name and arguments of plan step ``step`` (``offered``: tool name -> JSON schema, non-empty)."""
    planned = _planned(step, offered, words)
    if planned is not None:
        return planned
    names = list(offered)
    name = names[step % len(names)]
    return name, schema_arguments(offered[name], words)


def offered_tools(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Tool name -> parameters schema of the request's function tools, honouring ``tool_choice``."""
    offered: dict[str, dict[str, Any]] = {}
    for entry in body.get("tools") or []:
        fn = entry.get("function") if isinstance(entry, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            offered[fn["name"]] = params if isinstance(params, dict) else {}
    choice = body.get("tool_choice")
    if choice == "none":
        return {}
    if isinstance(choice, dict):
        chosen = (choice.get("function") or {}).get("name")
        if chosen in offered:
            return {chosen: offered[chosen]}
    return offered


# ----------------------------------------------------------------------------- scenarios

_URL_RE = re.compile(r"https?://[^\s\"'<>\]\)]+")
_IMAGE_URL_RE = re.compile(r"\.(png|jpe?g|gif|webp)(\?[^\s]*)?$", re.IGNORECASE)
_REF_LINE_RE = re.compile(r"- (\w+)[^\n]*?\[ref=((?:f\d+)?e\d+)\]")

SCENARIO_KEYWORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("browser", re.compile(r"\b(browse|browser|click|website|web ?page|fill in|form)\b", re.IGNORECASE)),
    (
        "image_gen",
        re.compile(
            r"\b(draw|paint|illustrate|(generate|create|make) an? (image|picture|drawing))\b", re.IGNORECASE
        ),
    ),
    ("vision", re.compile(r"\b(describe|analy[sz]e|look at|inspect)\b", re.IGNORECASE)),
    ("web", re.compile(r"\b(search|look up|find online|news|extract|web)\b", re.IGNORECASE)),
    (
        "moa",
        re.compile(r"\b(think hard|experts?|several models|hard problem|puzzle|mixture)\b", re.IGNORECASE),
    ),
)
"""Scenario chosen from the prompt's words: the first whose pattern matches and whose first tool is offered."""

SCENARIO_STEPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "browser": (
        ("browser_navigate",),
        ("browser_type",),
        ("browser_click",),
        ("browser_snapshot", "browser_console", "browser_get_images"),
        ("browser_scroll",),
        ("browser_press",),
        ("browser_back",),
        ("browser_vision",),
    ),
    "web": (("web_search",), ("web_extract",)),
    "vision": (("vision_analyze",),),
    "image_gen": (("image_generate",),),
    "moa": (("mixture_of_agents",),),
}
"""Tool calls of each scenario: groups of calls made in one turn, in order; a step is skipped when its
tool is not offered or its data is missing (the browser scenario takes 8 tool turns and a final answer)."""


@dataclass(frozen=True)
class Conversation:
    """What the scenario steps read: prompt text, options, tools called so far and their results."""

    text: str
    words: str
    options: MockOptions
    called: tuple[str, ...]
    results: tuple[str, ...]


def read_conversation(messages: list[Any], options: MockOptions) -> Conversation:
    """Prompt text (directives removed), tool names already called and tool results, in order."""
    called: list[str] = []
    results: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "assistant":
            for call in msg.get("tool_calls") or []:
                fn = (call.get("function") or {}) if isinstance(call, dict) else {}
                called.append(str(fn.get("name", "")))
        elif msg.get("role") == "tool":
            results.append(message_text(msg.get("content")))
    text = strip_directives(message_text(first_user_content(messages)))
    return Conversation(
        text=text,
        words=prompt_words(_URL_RE.sub(" ", text)),
        options=options,
        called=tuple(called),
        results=tuple(results),
    )


def page_url(conv: Conversation) -> str | None:
    """The page of the browser/web scenarios: option ``url``, else the prompt's first non-image URL."""
    if conv.options.url:
        return conv.options.url
    return next((u for u in _URL_RE.findall(conv.text) if not _IMAGE_URL_RE.search(u)), None)


def image_url(conv: Conversation) -> str | None:
    """The image of the vision scenario: option ``image_url``, else the prompt's first image URL."""
    if conv.options.image_url:
        return conv.options.image_url
    return next((u for u in _URL_RE.findall(conv.text) if _IMAGE_URL_RE.search(u)), None)


def choose_scenario(conv: Conversation, offered: dict[str, dict[str, Any]]) -> str | None:
    """The scenario of this conversation: option ``scenario``, else the first keyword match whose tools are offered."""
    if conv.options.scenario == "none":
        return None
    if conv.options.scenario:
        return conv.options.scenario
    for name, pattern in SCENARIO_KEYWORDS:
        groups = SCENARIO_STEPS[name] if name == "web" else SCENARIO_STEPS[name][:1]
        steps = [step for group in groups for step in group]
        if pattern.search(conv.text) and any(_step_args(name, s, conv, offered) is not None for s in steps):
            return name
    return None


def _latest_refs(conv: Conversation) -> list[tuple[str, str]]:
    """(role, ref) of the elements in the most recent tool result that holds a snapshot."""
    for result in reversed(conv.results):
        try:
            data = json.loads(result)
        except ValueError:
            continue
        snapshot = data.get("snapshot") if isinstance(data, dict) else None
        if isinstance(snapshot, str) and "[ref=" in snapshot:
            return _REF_LINE_RE.findall(snapshot)
    return []


def _search_url(conv: Conversation) -> str | None:
    for result in reversed(conv.results):
        try:
            web = json.loads(result)["data"]["web"]
            return web[0]["url"]
        except (ValueError, KeyError, IndexError, TypeError):
            continue
    return None


def _step_args(scenario: str, name: str, conv: Conversation, offered: dict[str, dict[str, Any]]):
    """Arguments of step ``name`` now, or None when the tool is not offered or the data is missing."""
    if name not in offered:
        return None
    words = conv.words
    if scenario == "browser" or name.startswith("browser_"):
        refs = _latest_refs(conv)
        by_role = lambda *roles: next((f"@{ref}" for role, ref in refs if role in roles), None)  # noqa: E731
        if name == "browser_navigate":
            url = page_url(conv)
            return {"url": url} if url else None
        if name == "browser_type":
            ref = by_role("textbox", "searchbox")
            return {"ref": ref, "text": words} if ref else None
        if name == "browser_click":
            ref = by_role("button") or by_role("link")
            return {"ref": ref} if ref else None
        return {
            "browser_snapshot": {"full": False},
            "browser_console": {"clear": False},
            "browser_get_images": {},
            "browser_scroll": {"direction": "down"},
            "browser_press": {"key": "Tab"},
            "browser_back": {},
            "browser_vision": {"question": "What does this page show?"},
        }.get(name)
    if name == "web_search":
        return {"query": words, "limit": 3}
    if name == "web_extract":
        url = page_url(conv) or _search_url(conv)
        return {"urls": [url]} if url else None
    if name == "vision_analyze":
        url = image_url(conv)
        return {"image_url": url, "question": f"What is shown? The user asks: {words}"} if url else None
    if name == "image_generate":
        return {"prompt": words, "aspect_ratio": "square"}
    if name == "mixture_of_agents":
        return {"user_prompt": conv.text.strip() or words}
    return None


def scenario_calls(
    scenario: str, conv: Conversation, offered: dict[str, dict[str, Any]], count: int
) -> list[tuple[str, dict[str, Any]]]:
    """The next calls of ``scenario``: the first group with steps not called yet whose arguments are
    known, then more groups while fewer than ``count`` (the ``parallel`` option) calls are planned."""
    calls: list[tuple[str, dict[str, Any]]] = []
    taken = set(conv.called)
    for group in SCENARIO_STEPS.get(scenario, ()):
        if calls and len(calls) >= count:
            break
        for name in group:
            args = None if name in taken else _step_args(scenario, name, conv, offered)
            if args is not None:
                calls.append((name, args))
                taken.add(name)
    return calls


def describe_images(content: Any) -> str | None:
    """What the mock "sees" in a message's image parts: type, size and sha256 of each data: URL image."""
    if not isinstance(content, list):
        return None
    seen = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "image_url":
            continue
        url = str((part.get("image_url") or {}).get("url", ""))
        match = re.match(r"data:([\w.+/-]+);base64,(.*)$", url, re.DOTALL)
        if match:
            try:
                data = base64.b64decode(match.group(2))
            except (binascii.Error, ValueError):
                seen.append("an undecodable image")
                continue
            digest = hashlib.sha256(data).hexdigest()[:16]
            seen.append(f"{match.group(1)}, {len(data)} bytes, sha256 {digest}")
        else:
            seen.append(f"an image at {url}")
    if not seen:
        return None
    return f"I see {len(seen)} image(s): " + "; ".join(seen) + "."


# ----------------------------------------------------------------------------- response


def _first_line(result: str) -> str:
    text = result
    try:
        parsed = json.loads(result)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for field in ("output", "content", "error", "analysis", "response"):
            if isinstance(parsed.get(field), str) and parsed[field].strip():
                text = parsed[field]
                break
        else:
            text = json.dumps(parsed, ensure_ascii=False)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return (line[:157] + "...") if len(line) > 160 else (line or "(empty)")


def _message_chars(messages: list[Any]) -> int:
    total = 0
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        total += len(message_text(msg.get("content")))
        for call in msg.get("tool_calls") or []:
            fn = (call.get("function") or {}) if isinstance(call, dict) else {}
            total += len(str(fn.get("name", ""))) + len(str(fn.get("arguments", "")))
    return total


def _with_reasoning(message: dict[str, Any], reasoning: str, options: MockOptions) -> None:
    if options.no_reasoning:
        return
    style = options.reasoning
    if style == "field":
        message["reasoning"] = reasoning
    elif style == "reasoning_content":
        message["reasoning_content"] = reasoning
    elif style == "details":
        message["reasoning_details"] = [{"type": "reasoning.text", "text": reasoning}]
    else:
        tag = "think" if style == "think" else "REASONING_SCRATCHPAD"
        message["content"] = f"<{tag}>\n{reasoning}\n</{tag}>\n{message['content'] or ''}"


def completion(
    body: dict[str, Any],
    options: MockOptions,
    key: str,
    request_number: int,
    model: str,
    final_answer: Callable[[], str] | None = None,
) -> dict[str, Any]:
    """The ``chat.completion`` body answering ``body`` (a Chat Completions request).

    Args:
        body: the request JSON (``messages`` a list).
        options: merged model-id options and prompt directives.
        key: conversation key.
        request_number: 0-based index of this request within its conversation.
        model: the requested model id, echoed.
        final_answer: called for the text of a final answer (the ``answers`` option), else None.
    """
    messages = body.get("messages") or []
    if options.summarise:
        return _reply(
            key,
            request_number,
            model,
            messages,
            {"role": "assistant", "content": summary_reply(messages, options.summary_words)},
            options,
        )
    if options.judge:
        return _reply(
            key,
            request_number,
            model,
            messages,
            {"role": "assistant", "content": judge_reply(messages)},
            options,
        )
    turn = read_turn(messages)
    k = turn.turn
    offered = offered_tools(body)
    wants_tools = bool(offered) and (
        options.loop or body.get("tool_choice") == "required" or k < options.turns
    )
    conv = read_conversation(messages, options)
    scenario = choose_scenario(conv, offered) if offered else None
    planned = scenario_calls(scenario, conv, offered, options.parallel) if scenario else []
    if scenario and "turns" not in options.model_fields_set:
        # a scenario runs to its end unless the turns option says otherwise
        wants_tools = bool(planned) or (
            bool(offered) and (options.loop or body.get("tool_choice") == "required")
        )
    message: dict[str, Any] = {"role": "assistant", "content": None}
    out_chars = 0
    if wants_tools:
        calls = []
        for i in range(max(options.parallel, len(planned))):
            if planned:
                if i >= len(planned):
                    break
                name, args = planned[i]
            else:
                name, args = plan_call(k * options.parallel + i, offered, turn.words)
            if options.command and name == "terminal" and k == 0 and i == 0:
                args = {**args, "command": options.command}
            arguments = json.dumps(args, ensure_ascii=False)
            if k < options.unknown_tool:
                name = UNKNOWN_TOOL_NAME
                while name in offered:
                    name += "_x"
            if k < options.bad_args:
                arguments = arguments[:-1]  # truncated: invalid JSON
            calls.append(
                {
                    "id": f"call_{k}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
            out_chars += len(name) + len(arguments)
        names = ", ".join(dict.fromkeys(c["function"]["name"] for c in calls))
        message["content"] = f"Calling {names}."
        message["tool_calls"] = calls
        reasoning = f'Turn {k}: the task is about "{turn.words}". Next I call {names} to make progress.'
        finish_reason = "tool_calls"
    else:
        if turn.last_tool_result is not None:
            content = (
                f'Done with "{turn.words}" after {turn.tool_results} tool result(s). '
                f"The last one said: {_first_line(turn.last_tool_result)}"
            )
            reasoning = f"I have {turn.tool_results} tool result(s); that is enough to answer."
        else:
            content = f'Answer to "{turn.words}": this is the mock model\'s deterministic reply.'
            seen = describe_images(first_user_content(messages))
            if seen:
                content = f'Answer to "{turn.words}": {seen}'
            reasoning = f'The user asks about "{turn.words}"; I can answer directly without tools.'
        if options.answer is not None:
            content = options.answer
        if final_answer is not None:  # the answers option: called only for a final answer
            content = final_answer()
        if options.lone_surrogate:
            content += "\ud83d"  # half of a UTF-16 pair: JSON can carry it (as an escape), UTF-8 cannot
        finish_reason = "stop"
        if options.length:
            content = content[: max(1, len(content) // 2)]
            finish_reason = "length"
        message["content"] = content
    _with_reasoning(message, reasoning, options)
    out_chars += len(message["content"] or "")
    reasoning_tokens = 0 if options.no_reasoning else max(1, len(reasoning) // 4)
    if not options.no_reasoning and options.reasoning not in ("think", "scratchpad"):
        out_chars += len(reasoning)
    return _reply(
        key, request_number, model, messages, message, options, finish_reason, out_chars, reasoning_tokens
    )


def summary_reply(messages: list[Any], words: int) -> str:
    """The mock summariser's reply: exactly ``words`` words separated by single spaces (see ``MockOptions.summarise``)."""
    text = message_text(messages[-1].get("content")) if messages and isinstance(messages[-1], dict) else ""
    found = re.findall(r"[a-z0-9]+", text.lower()) or ["summary"]
    return " ".join(found[i % len(found)] for i in range(words))


def judge_reply(messages: list[Any]) -> str:
    """The mock judge's reply to a :func:`hermes_core.scoring.judge_messages` request (see ``MockOptions.judge``)."""
    from hermes_core.scoring import final_answers, normalise_answer

    case = message_text(messages[-1].get("content")) if messages and isinstance(messages[-1], dict) else ""
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", case, re.DOTALL | re.MULTILINE))
    reference = sections.get("Reference answer", "").strip()
    final = sections.get("Final answer of the agent", "").strip()
    if not final or final == "(no final answer)":
        return "FAIL\nThe agent gave no final answer."
    if reference in ("", "(none given)"):
        return "PASS\nThe agent gave a final answer and there is no reference to compare."
    accepted = {normalise_answer(a) for a in reference.split(" | ")}
    if any(normalise_answer(c) in accepted for c in final_answers(final)):
        return "PASS\nThe final answer matches the reference answer."
    return "FAIL\nThe final answer differs from the reference answer."


def _reply(
    key: str,
    request_number: int,
    model: str,
    messages: list[Any],
    message: dict[str, Any],
    options: MockOptions,
    finish_reason: str = "stop",
    out_chars: int | None = None,
    reasoning_tokens: int = 0,
) -> dict[str, Any]:
    """The ``chat.completion`` body carrying ``message``, with usage counted from the characters (4 per token)."""
    out_chars = len(message.get("content") or "") if out_chars is None else out_chars
    prompt_tokens = max(1, _message_chars(messages) // 4)
    completion_tokens = max(1, out_chars // 4)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }
    if options.cost is not None:
        usage["cost"] = options.cost
    return {
        "id": f"chatcmpl-mock-{key}-{request_number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": usage,
    }
