"""Options of the mock model: the model id's query string and per-prompt ``[mock:...]`` directives.

``mock/scripted?latency_ms=200&fail_rate=0.1&seed=3`` sets options for every
request with that model id; a first user message containing
``[mock:rate_limit=2,no_reasoning]`` adds or overrides options for that
conversation only. A bare flag (``loop``, ``[mock:length]``) means true.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hermes_core.exceptions import ConfigError

MOCK_PREFIX = "mock/"

ReasoningStyle = Literal["field", "reasoning_content", "details", "think", "scratchpad"]
Scenario = Literal["browser", "web", "vision", "image_gen", "moa", "none"]

_DIRECTIVE_RE = re.compile(r"\[mock:([^\]]*)\]")


class MockOptions(BaseModel):
    """Behaviour and faults of the mock model; every fault is off by default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: int = Field(
        2, ge=0, description="Tool-calling turns before the final answer (when tools are offered)."
    )
    parallel: int = Field(1, ge=1, le=16, description="Tool calls emitted in one tool-calling turn.")
    seed: int = Field(0, description="Seed of the hashes that pick failing and slow conversations.")
    reasoning: ReasoningStyle = Field(
        "field",
        description=(
            "Where reasoning goes: field (message.reasoning), reasoning_content, details "
            "(reasoning_details list), think (<think> in content), scratchpad (<REASONING_SCRATCHPAD> in content)."
        ),
    )
    no_reasoning: bool = Field(False, description="Emit no reasoning at all.")
    cost: float | None = Field(None, ge=0, description="usage.cost reported per request, in USD.")
    latency_ms: int = Field(0, ge=0, description="Delay of every request, milliseconds (non-blocking).")
    slow_rate: float = Field(
        0.0, ge=0, le=1, description="Fraction of conversations that use slow_latency_ms."
    )
    slow_latency_ms: int = Field(0, ge=0, description="Delay of the slow conversations, milliseconds.")
    rate_limit: int = Field(0, ge=0, description="First N requests of each conversation answer 429.")
    retry_after: float = Field(1.0, ge=0, description="Retry-After header of the 429 answers, seconds.")
    max_in_flight: int = Field(
        0,
        ge=0,
        description="A provider's concurrency limit: while more than K requests are being served, the "
        "extra ones answer 429 at once (with retry_after); 0 = no limit.",
    )
    error_5xx: int = Field(
        0, ge=0, description="Next N requests (after the rate_limit ones) answer error_status."
    )
    error_status: int = Field(
        500, ge=500, le=599, description="HTTP status of error_5xx and fail_rate answers."
    )
    judge: bool = Field(
        False,
        description="Answer as an LLM judge (implied by the model id mock/judge): PASS when the request's "
        "'## Final answer of the agent' section matches its '## Reference answer' by the answer scorer's "
        "rule, FAIL otherwise; with no reference, PASS for any final answer.",
    )
    summarise: bool = Field(
        False,
        description="Answer as a summariser (implied by the model id mock/summariser): the reply is exactly "
        "summary_words words, the words of the request's last message in turn (lowercased letters and digits; "
        "'summary' when it has none), so its length is known.",
    )
    summary_words: int = Field(50, ge=1, description="Words of a summarise reply.")
    echo_auth: bool = Field(
        False,
        description="Answer 401 quoting the request's Authorization header in the error message, as some "
        "providers do (tests that the key never reaches a log, a state or a file).",
    )
    fail_rate: float | None = Field(
        None, ge=0, le=1, description="Fraction of conversations (seeded hash) that fail on every request."
    )
    fail_file: str | None = Field(
        None,
        description="Failures of fail_rate apply only while this file exists; without fail_rate every conversation fails.",
    )
    hang_s: float = Field(
        0.0, ge=0, description="Sleep of the hanging requests, seconds (lets a client timeout fire)."
    )
    hang_count: int = Field(1, ge=0, description="Number of first requests of each conversation that hang.")
    bad_args: int = Field(0, ge=0, description="First N tool-calling turns have invalid JSON arguments.")
    unknown_tool: int = Field(
        0, ge=0, description="First N tool-calling turns call a tool that is not offered."
    )
    loop: bool = Field(False, description="Always call tools, never give a final answer.")
    length: bool = Field(False, description='The final answer is cut: finish_reason "length".')
    command: str | None = Field(
        None,
        description="Command of the first turn's terminal call instead of the plan's `ls -la && echo ...` "
        "(in a prompt directive it cannot contain `,` or `]`).",
    )
    answer: str | None = Field(
        None,
        description="Text of the final answer instead of the deterministic reply (in a prompt directive it "
        "cannot contain `,` or `]`).",
    )
    answers: str | None = Field(
        None,
        description="Final answers given in turn to the samples of one prompt, separated by `|`: the n-th "
        "final answer the server gives that conversation (its first user message) is the (n mod count)-th "
        "(e.g. `right|wrong`: half of any even number of samples pass, whatever their order).",
    )
    lone_surrogate: bool = Field(
        False,
        description="Append a lone UTF-16 surrogate (U+D83D, half an emoji) to the final answer, as a "
        "broken provider may; it travels as the JSON escape \\ud83d.",
    )
    url: str | None = Field(
        None,
        description="Page the browser and web scenarios open or extract; default: the first non-image URL of the prompt.",
    )
    image_url: str | None = Field(
        None, description="Image the vision scenario analyses; default: the first image URL of the prompt."
    )
    scenario: Scenario | None = Field(
        None,
        description=(
            "Tool scenario to follow (browser, web, vision, image_gen, moa); default: chosen from the prompt's "
            "words among the offered tools. Without an explicit turns option a scenario runs to its end."
        ),
    )


OPTION_NAMES: tuple[str, ...] = tuple(MockOptions.model_fields)


def is_mock_model(model: str) -> bool:
    """True when ``model`` names the built-in mock model (it starts with ``mock/``)."""
    return isinstance(model, str) and model.startswith(MOCK_PREFIX)


def model_id_options(model: str) -> dict[str, str]:
    """Raw options of a mock model id's query string (``{name: value}``, a bare flag gives ``"true"``);
    the id ``mock/judge`` sets ``judge``, ``mock/summariser`` sets ``summarise``.

    Raises:
        ConfigError (a ValueError): ``model`` is not a ``mock/`` id.
    """
    if not is_mock_model(model):
        raise ConfigError(f"not a mock model id: {model!r} (must start with {MOCK_PREFIX!r})")
    name, _, query = model.partition("?")
    implied = {f"{MOCK_PREFIX}judge": "judge", f"{MOCK_PREFIX}summariser": "summarise"}
    raw: dict[str, str] = {implied[name]: "true"} if name in implied else {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        raw[key.strip()] = value.strip() if value.strip() else "true"
    return raw


def prompt_directives(text: str) -> dict[str, str]:
    """Raw options of every ``[mock:key=value,flag]`` directive in ``text``, later ones winning."""
    raw: dict[str, str] = {}
    for match in _DIRECTIVE_RE.finditer(text):
        for item in match.group(1).split(","):
            key, sep, value = item.partition("=")
            if key.strip():
                raw[key.strip()] = value.strip() if sep and value.strip() else "true"
    return raw


def strip_directives(text: str) -> str:
    """``text`` without its ``[mock:...]`` directives."""
    return _DIRECTIVE_RE.sub("", text)


def build_options(raw: dict[str, Any]) -> MockOptions:
    """Validate raw options into :class:`MockOptions`.

    Raises:
        ConfigError (a ValueError): an unknown option or a bad value; the message names the option.
    """
    unknown = sorted(set(raw) - set(OPTION_NAMES))
    if unknown:
        raise ConfigError(f"unknown mock option {unknown[0]!r}; known options: {', '.join(OPTION_NAMES)}")
    try:
        return MockOptions.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(part) for part in err["loc"]) or "options"
        raise ConfigError(f"invalid value {raw.get(name)!r} for mock option {name!r}: {err['msg']}") from None


def parse_model_options(model: str) -> MockOptions:
    """Options in the query string of a mock model id.

    Examples:
        >>> parse_model_options("mock/scripted?latency_ms=200&fail_rate=0.1&seed=3").latency_ms
        200
        >>> parse_model_options("mock/scripted?loop").loop
        True

    Raises:
        ConfigError (a ValueError): not a ``mock/`` id, an unknown option or a bad value (named).
    """
    return build_options(model_id_options(model))
