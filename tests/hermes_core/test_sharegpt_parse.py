"""ShareGPT turns read back (hermes_core.sharegpt_parse) against hand-written rows, and round trips."""

from __future__ import annotations

import pytest

from hermes_core.sharegpt_parse import (
    GptTurn,
    ToolCall,
    ToolResponse,
    TurnFormatError,
    parse_gpt_turn,
    parse_system_tools,
    parse_tool_turn,
    to_chat_messages,
)
from hermes_core.trajectory import to_sharegpt

SYSTEM = (
    "You are a function-calling AI model.\n<tools>\n"
    '[{"name": "terminal", "description": "Run a shell command.", "parameters": {"type": "object", '
    '"properties": {"command": {"type": "string"}}, "required": ["command"]}, "required": null}]\n'
    "</tools>\nCall them inside <tool_call> </tool_call> tags."
)
TERMINAL = {
    "name": "terminal",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}

# README § Outputs worked example, as written in a row
WORKED = [
    {"from": "system", "value": SYSTEM},
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


def test_worked_example_as_chat_messages():
    messages, tools = to_chat_messages(WORKED)
    assert tools == [{"type": "function", "function": TERMINAL}]
    assert messages == [
        {
            "role": "system",
            "content": SYSTEM,
            "reasoning": None,
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
        },
        {
            "role": "user",
            "content": "What files are here?",
            "reasoning": None,
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
        },
        {
            "role": "assistant",
            "content": "",
            "reasoning": "List the files.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
                }
            ],
            "tool_call_id": None,
            "name": None,
        },
        {
            "role": "tool",
            "content": '{"output": "a.txt", "exit_code": 0, "error": null}',
            "reasoning": None,
            "tool_calls": None,
            "tool_call_id": "call_1",
            "name": "terminal",
        },
        {
            "role": "assistant",
            "content": "One file.",
            "reasoning": "Done.",
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
        },
    ]


def test_gpt_turn_with_content_two_calls_and_raw_arguments():
    value = (
        "<think>\nTwo steps.\nThen more.\n</think>\nI will look.\nTwice.\n"
        '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo ü"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": "not json {"}\n</tool_call>'
    )
    assert parse_gpt_turn(value) == GptTurn(
        reasoning="Two steps.\nThen more.",
        content="I will look.\nTwice.",
        calls=[ToolCall("terminal", {"command": "echo ü"}), ToolCall("read_file", "not json {")],
    )


def test_gpt_turn_without_reasoning_or_calls():
    assert parse_gpt_turn("<think>\n</think>\nJust an answer.") == GptTurn(None, "Just an answer.", [])
    assert parse_gpt_turn("<think>\n</think>") == GptTurn(None, "", [])
    # a <think> block later in the content (a renamed scratchpad) stays content
    assert parse_gpt_turn("<think>\n</think>\nx <think>y</think>") == GptTurn(None, "x <think>y</think>", [])


def test_tool_turn_with_two_responses_string_and_json_content():
    value = (
        '<tool_response>\n{"tool_call_id": "a", "name": "terminal", "content": "plain text"}\n</tool_response>\n'
        '<tool_response>\n{"tool_call_id": "b", "name": "web", "content": [1, 2]}\n</tool_response>'
    )
    assert parse_tool_turn(value) == [
        ToolResponse("a", "terminal", "plain text"),
        ToolResponse("b", "web", [1, 2]),
    ]


def test_system_tools_in_both_structures():
    assert parse_system_tools(SYSTEM) == [TERMINAL]
    wrapped = '<tools>\n[{"type": "function", "function": {"name": "x", "description": "X."}}]\n</tools>'
    assert parse_system_tools(wrapped) == [{"name": "x", "description": "X.", "parameters": {}}]
    assert parse_system_tools("<tools>\n[]\n</tools>") == []


def test_calls_without_responses_get_positional_ids():
    turns = [
        {"from": "system", "value": "<tools>\n[]\n</tools>"},
        {"from": "human", "value": "q"},
        {
            "from": "gpt",
            "value": '<think>\nr\n</think>\n<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>',
        },
    ]
    messages, tools = to_chat_messages(turns)
    assert tools == []
    assert messages[2]["tool_calls"] == [
        {"id": "call_2_0", "type": "function", "function": {"name": "x", "arguments": "{}"}}
    ]


@pytest.mark.parametrize(
    ("turn", "message"),
    [
        ({"from": "gpt", "value": "no think block"}, "does not start with a <think> block"),
        ({"from": "gpt", "value": "<think>\n</think>\n<tool_call>\n{oops}\n</tool_call>"}, "not JSON"),
        ({"from": "tool", "value": "nothing"}, "no <tool_response> block"),
        ({"from": "system", "value": "no tools here"}, "no <tools> block"),
        ({"from": "robot", "value": ""}, "unknown turn kind 'robot'"),
    ],
)
def test_malformed_turns_raise(turn, message):
    with pytest.raises(TurnFormatError, match=message):
        to_chat_messages([turn])


def test_round_trip_of_the_converter():
    """to_sharegpt then to_chat_messages gives back the agent's conversation."""
    tool_def = {"type": "function", "function": TERMINAL}
    conversation = [
        {"role": "user", "content": "Count <b>files</b>"},
        {
            "role": "assistant",
            "content": "Counting.",
            "reasoning": "Use ls.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": '{"command": "ls | wc -l"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": '{"command": "pwd"}'},
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "terminal",
            "content": '{"output": "3", "exit_code": 0}',
        },
        {"role": "tool", "tool_call_id": "c2", "name": "terminal", "content": "/tmp"},
        {"role": "assistant", "content": "Three.", "reasoning": None},
    ]
    messages, tools = to_chat_messages(to_sharegpt(conversation, [tool_def]))
    assert tools == [tool_def]
    assert [(m["role"], m["content"], m["reasoning"], m["tool_call_id"]) for m in messages[1:]] == [
        ("user", "Count <b>files</b>", None, None),
        ("assistant", "Counting.", "Use ls.", None),
        ("tool", '{"output": "3", "exit_code": 0}', None, "c1"),
        ("tool", "/tmp", None, "c2"),
        ("assistant", "Three.", None, None),
    ]
    assert messages[2]["tool_calls"] == conversation[1]["tool_calls"]
