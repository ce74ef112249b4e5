"""ShareGPT conversion, reasoning extraction and tool statistics (README § Outputs), against hand-written rows."""

from __future__ import annotations

import json

import pytest

from hermes_core.trajectory import (
    extract_reasoning,
    has_reasoning,
    hermes_system_prompt,
    is_tool_failure,
    reasoning_counts,
    split_inline_reasoning,
    to_sharegpt,
    tool_statistics,
)

TERMINAL_TOOL = {
    "type": "function",
    "function": {
        "name": "terminal",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
TOOLS = [TERMINAL_TOOL]

# The system turn of TOOLS, written by hand: the reference's flattened tool entry (name, description,
# parameters, required: null, in that order), not the OpenAI wire wrapper.
SYSTEM_VALUE = (
    "You are a function-calling AI model. The functions you can call are described as JSON signatures "
    "inside the <tools> </tools> XML tags below. Call one or more of them when they help with the user's "
    "request; when none is relevant, answer in plain conversational language. Do not guess argument values.\n"
    "<tools>\n"
    '[{"name": "terminal", "description": "Run a shell command.", "parameters": {"type": "object", '
    '"properties": {"command": {"type": "string"}}, "required": ["command"]}, "required": null}]\n'
    "</tools>\n"
    "To call a function, write a JSON object with the function's name and its arguments, "
    '{"name": <function-name>, "arguments": <arguments-object>}, inside <tool_call> </tool_call> XML tags, '
    "one block per call:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call>\n'
    "Each function's result is returned to you inside <tool_response> </tool_response> XML tags."
)


def user(text):
    return {"role": "user", "content": text}


def assistant(content=None, reasoning=None, calls=(), **extra):
    message = {"role": "assistant", "content": content, "reasoning": reasoning, "finish_reason": "stop"}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls
        ]
        message["finish_reason"] = "tool_calls"
    message.update(extra)
    return message


def tool(call_id, name, content):
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def values(turns):
    """The turns after the system turn, as (from, value) pairs."""
    assert turns[0] == {"from": "system", "value": SYSTEM_VALUE}
    return [(t["from"], t["value"]) for t in turns[1:]]


# --- worked example (README § Outputs, byte-exact) -------------------------------------------------


def test_worked_example_byte_exact():
    messages = [
        user("What files are here?"),
        assistant(None, "List the files.", [("call_1", "terminal", '{"command": "ls"}')]),
        tool("call_1", "terminal", '{"output": "a.txt", "exit_code": 0, "error": null}'),
        assistant("One file.", "Done."),
    ]
    turns = to_sharegpt(messages, TOOLS)
    assert turns == [
        {"from": "system", "value": SYSTEM_VALUE},
        {"from": "human", "value": "What files are here?"},
        {
            "from": "gpt",
            "value": '<think>\nList the files.\n</think>\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>',
        },
        {
            "from": "tool",
            "value": '<tool_response>\n{"tool_call_id": "call_1", "name": "terminal", "content": {"output": "a.txt", "exit_code": 0, "error": null}}\n</tool_response>',
        },
        {"from": "gpt", "value": "<think>\nDone.\n</think>\nOne file."},
    ]
    assert tool_statistics(messages, ["terminal"]) == (
        {"terminal": {"count": 1, "success": 1, "failure": 0}},
        {"terminal": 0},
    )
    assert reasoning_counts(messages) == (2, 2)


# --- system prompt -----------------------------------------------------------------------------------


def test_system_prompt_lists_tools_in_the_reference_structure():
    prompt = hermes_system_prompt(TOOLS)
    assert prompt == SYSTEM_VALUE
    listed = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert list(json.loads(listed)[0]) == ["name", "description", "parameters", "required"]
    assert "<tools>\n[]\n</tools>" in hermes_system_prompt([])


def test_system_prompt_entry_defaults_and_order_of_tools():
    tools = [
        {"type": "function", "function": {"name": "b_tool"}},
        {"type": "function", "function": {"name": "a_tool", "description": "A.", "parameters": {}}},
    ]
    listed = hermes_system_prompt(tools).split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert listed == (
        '[{"name": "b_tool", "description": "", "parameters": {}, "required": null}, '
        '{"name": "a_tool", "description": "A.", "parameters": {}, "required": null}]'
    )


def test_system_prompt_keeps_non_ascii():
    tools = [{"type": "function", "function": {"name": "wetter", "description": "Temperatur in °C"}}]
    assert '{"name": "wetter", "description": "Temperatur in °C", "parameters": {}, "required": null}' in (
        hermes_system_prompt(tools)
    )


# --- gpt turns ---------------------------------------------------------------------------------------


def test_plain_answer_without_tools():
    turns = to_sharegpt([user("Hi"), assistant("  Hello!  \n", "Greet back.")], TOOLS)
    assert values(turns) == [("human", "Hi"), ("gpt", "<think>\nGreet back.\n</think>\nHello!")]


def test_no_reasoning_gives_empty_think_block():
    turns = to_sharegpt([user("Hi"), assistant("Hello!")], TOOLS)
    assert values(turns) == [("human", "Hi"), ("gpt", "<think>\n</think>\nHello!")]
    empty = to_sharegpt([user("Hi"), assistant(None)], TOOLS)
    assert values(empty)[-1] == ("gpt", "<think>\n</think>")


def test_content_and_several_calls_then_merged_tool_results():
    messages = [
        user("Check two things."),
        assistant(
            "Running both.",
            "Two commands.",
            [("c1", "terminal", '{"command": "pwd"}'), ("c2", "read_file", '{"path": "a.txt"}')],
        ),
        tool("c1", "terminal", '{"output": "/tmp", "exit_code": 0, "error": null}'),
        tool("c2", "read_file", '{"content": "     1|hi", "total_lines": 1}'),
        user("And now?"),
        assistant("Done."),
    ]
    assert values(to_sharegpt(messages, TOOLS)) == [
        ("human", "Check two things."),
        (
            "gpt",
            "<think>\nTwo commands.\n</think>\nRunning both.\n"
            '<tool_call>\n{"name": "terminal", "arguments": {"command": "pwd"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>',
        ),
        (
            "tool",
            '<tool_response>\n{"tool_call_id": "c1", "name": "terminal", "content": {"output": "/tmp", "exit_code": 0, "error": null}}\n</tool_response>\n'
            '<tool_response>\n{"tool_call_id": "c2", "name": "read_file", "content": {"content": "     1|hi", "total_lines": 1}}\n</tool_response>',
        ),
        ("human", "And now?"),
        ("gpt", "<think>\n</think>\nDone."),
    ]


def test_reasoning_content_field():
    message = {"role": "assistant", "content": "42", "reasoning_content": "  Compute it.  "}
    assert extract_reasoning(message) == "Compute it."
    assert values(to_sharegpt([user("q"), message], TOOLS))[-1] == (
        "gpt",
        "<think>\nCompute it.\n</think>\n42",
    )


def test_reasoning_details_list():
    message = {
        "role": "assistant",
        "content": "42",
        "reasoning_details": [
            {"type": "reasoning.summary", "summary": "First part."},
            {"type": "reasoning.encrypted", "data": "b64=="},
            {"type": "reasoning.text", "text": "Second part."},
        ],
    }
    assert extract_reasoning(message) == "First part.\nSecond part."
    assert values(to_sharegpt([user("q"), message], TOOLS))[-1] == (
        "gpt",
        "<think>\nFirst part.\nSecond part.\n</think>\n42",
    )


def test_extract_reasoning_order_and_empties():
    assert extract_reasoning({"reasoning": "a", "reasoning_content": "b"}) == "a"
    assert extract_reasoning({"reasoning": "  ", "reasoning_content": "b"}) == "b"
    assert extract_reasoning({"reasoning": None, "reasoning_content": "", "reasoning_details": []}) is None
    assert extract_reasoning({"reasoning_details": [{"type": "reasoning.encrypted", "data": "x"}]}) is None
    assert extract_reasoning({"content": "<think>inline</think>x"}) is None


def test_inline_think_block_moves_into_leading_think():
    message = assistant("<think>\nInline plan.\n</think>\n\nThe answer.")
    assert values(to_sharegpt([user("q"), message], TOOLS))[-1] == (
        "gpt",
        "<think>\nInline plan.\n</think>\nThe answer.",
    )


def test_scratchpad_renamed_to_think():
    inline = assistant("<REASONING_SCRATCHPAD>Plan it.</REASONING_SCRATCHPAD>\nAnswer.")
    assert values(to_sharegpt([user("q"), inline], TOOLS))[-1] == (
        "gpt",
        "<think>\nPlan it.\n</think>\nAnswer.",
    )
    # With native reasoning the scratchpad stays in the content, renamed to think.
    native = assistant("<REASONING_SCRATCHPAD>More.</REASONING_SCRATCHPAD> Answer.", "Native.")
    assert values(to_sharegpt([user("q"), native], TOOLS))[-1] == (
        "gpt",
        "<think>\nNative.\n</think>\n<think>More.</think> Answer.",
    )


def test_split_inline_reasoning():
    assert split_inline_reasoning(None) == (None, "")
    assert split_inline_reasoning("plain") == (None, "plain")
    assert split_inline_reasoning("<think> a </think>\nrest ") == ("a", "rest")
    assert split_inline_reasoning("<think></think>rest") == (None, "rest")
    assert split_inline_reasoning("x <REASONING_SCRATCHPAD>b</REASONING_SCRATCHPAD> y") == ("b", "x  y")
    assert split_inline_reasoning("<think>a</think><think>b</think>c") == ("a\nb", "c")


def test_has_reasoning():
    assert has_reasoning(assistant("x", "r"))
    assert has_reasoning({"role": "assistant", "content": "x", "reasoning_content": "r"})
    assert has_reasoning(assistant("<think>r</think>x"))
    assert has_reasoning(assistant("<REASONING_SCRATCHPAD>r</REASONING_SCRATCHPAD>x"))
    assert not has_reasoning(assistant("<think>  </think>x"))
    assert not has_reasoning(assistant("x"))
    assert not has_reasoning(assistant(None))


def test_invalid_json_arguments_kept_raw():
    message = assistant(None, "Try.", [("c1", "terminal", '{"command": "ls"')])
    assert values(to_sharegpt([user("q"), message], TOOLS))[-1] == (
        "gpt",
        '<think>\nTry.\n</think>\n<tool_call>\n{"name": "terminal", "arguments": "{\\"command\\": \\"ls\\""}\n</tool_call>',
    )


def test_non_json_tool_content_kept_as_string():
    messages = [
        user("q"),
        assistant(None, "Try.", [("c1", "terminal", "{}")]),
        tool("c1", "terminal", "Error: no such tool"),
    ]
    assert values(to_sharegpt(messages, TOOLS))[-1] == (
        "tool",
        '<tool_response>\n{"tool_call_id": "c1", "name": "terminal", "content": "Error: no such tool"}\n</tool_response>',
    )


def test_non_ascii_preserved():
    messages = [
        user("Schreib „Grüße“ 日本"),
        assistant("Fertig ✓", "Überlegung", [("c1", "write_file", '{"path": "ä.txt", "content": "日本"}')]),
        tool("c1", "write_file", '{"bytes_written": 6, "path": "ä.txt"}'),
    ]
    assert values(to_sharegpt(messages, TOOLS)) == [
        ("human", "Schreib „Grüße“ 日本"),
        (
            "gpt",
            "<think>\nÜberlegung\n</think>\nFertig ✓\n"
            '<tool_call>\n{"name": "write_file", "arguments": {"path": "ä.txt", "content": "日本"}}\n</tool_call>',
        ),
        (
            "tool",
            '<tool_response>\n{"tool_call_id": "c1", "name": "write_file", "content": {"bytes_written": 6, "path": "ä.txt"}}\n</tool_response>',
        ),
    ]


def test_system_messages_never_appear_and_unknown_role_rejected():
    turns = to_sharegpt([{"role": "system", "content": "EPHEMERAL"}, user("q"), assistant("a")], TOOLS)
    assert all("EPHEMERAL" not in t["value"] for t in turns)
    with pytest.raises(ValueError, match="developer"):
        to_sharegpt([{"role": "developer", "content": "x"}], TOOLS)


# --- tool failure classification -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "failed"),
    [
        ('{"error": null}', False),
        ('{"output": "ok", "error": null}', False),
        ('{"error": "boom"}', True),
        ('{"error": ""}', True),
        ('{"success": true}', False),
        ('{"success": false}', True),
        ('{"success": true, "error": "x"}', True),
        ('{"content": {"error": "x"}}', True),
        ('{"content": {"error": null}}', False),
        ('{"content": "error: text inside is fine"}', False),
        ('{"exit_code": 1, "error": null}', False),
        ('{"exit_code": 1}', False),
        ("[]", False),
        ('[{"error": "x"}]', False),
        ('"fine"', False),
        ('"Error: quoted"', True),
        ('""', True),
        ("42", False),
        ("null", False),
        ("", True),
        ("   \n", True),
        ("Error: boom", True),
        ("  error: indented", True),
        ("ERROR:upper", True),
        ("plain text", False),
        ("an error: in the middle", False),
        ("Errors are fine", False),
        ("NaN", False),
    ],
)
def test_is_tool_failure(content, failed):
    assert is_tool_failure(content) is failed


# --- statistics -------------------------------------------------------------------------------------


def test_tool_statistics_zero_filled_sorted_with_unknown_tool():
    messages = [
        user("q"),
        assistant(
            None,
            "r",
            [
                ("c1", "terminal", '{"command": "ls"}'),
                ("c2", "terminal", '{"command": "false"}'),
                ("c3", "read_file", '{"path": "x"}'),
            ],
        ),
        tool("c1", "terminal", '{"output": "", "exit_code": 0, "error": null}'),
        tool("c2", "terminal", '{"output": "", "exit_code": 1, "error": null}'),
        tool("c3", "read_file", '{"error": "File not found"}'),
        assistant(None, None, [("c4", "hallucinated_tool", "{}"), ("c5", "terminal", "{}")]),
        tool("c4", "hallucinated_tool", '{"error": "Unknown tool: hallucinated_tool"}'),
        # c5 never got a result: counts as a failure
        assistant("done"),
    ]
    stats, errors = tool_statistics(messages, ["web_search", "terminal", "read_file", "patch"])
    assert stats == {
        "hallucinated_tool": {"count": 1, "success": 0, "failure": 1},
        "patch": {"count": 0, "success": 0, "failure": 0},
        "read_file": {"count": 1, "success": 0, "failure": 1},
        "terminal": {"count": 3, "success": 2, "failure": 1},
        "web_search": {"count": 0, "success": 0, "failure": 0},
    }
    assert list(stats) == ["hallucinated_tool", "patch", "read_file", "terminal", "web_search"]
    assert errors == {"hallucinated_tool": 1, "patch": 0, "read_file": 1, "terminal": 1, "web_search": 0}
    assert list(errors) == list(stats)


def test_tool_statistics_without_calls():
    stats, errors = tool_statistics([user("q"), assistant("a")], ["b", "a"])
    assert list(stats.items()) == [
        ("a", {"count": 0, "success": 0, "failure": 0}),
        ("b", {"count": 0, "success": 0, "failure": 0}),
    ]
    assert list(errors.items()) == [("a", 0), ("b", 0)]


def test_reasoning_counts():
    messages = [
        user("q"),
        assistant(None, "native", [("c1", "terminal", "{}")]),
        tool("c1", "terminal", '{"error": null}'),
        assistant("<think>inline</think>ok", None, [("c2", "terminal", "{}")]),
        tool("c2", "terminal", '{"error": null}'),
        assistant("<think></think>no reasoning here"),
        {"role": "assistant", "content": "x", "reasoning_details": [{"type": "reasoning.text", "text": "d"}]},
    ]
    assert reasoning_counts(messages) == (4, 3)
    assert reasoning_counts([user("q")]) == (0, 0)
