"""One declaration per option: the CLI's flags and the flow's parameters come from BatchConfig and its nested models."""

from __future__ import annotations

import pytest
from prefect.utilities.callables import parameter_schema

from flows.cli import CLI_ONLY, build_run_parser, config_from_args
from flows.config import BatchConfig, OptionError, run_options
from flows.generate import generate_trajectories
from hermes_core.settings import (
    BrowserSettings,
    HermesSettings,
    ImageSettings,
    LimitSettings,
    MoaSettings,
    ModelEndpointSettings,
    SandboxSettings,
    VisionSettings,
    WebSettings,
)


def test_flags_and_flow_parameters_are_the_options():
    options = run_options()
    parser = build_run_parser()
    flags = {a.dest for a in parser._actions if a.dest != "help"} - CLI_ONLY
    schema = parameter_schema(generate_trajectories).model_dump()
    assert flags == set(options) == set(schema["properties"])
    assert schema["required"] == ["dataset_file", "batch_size", "run_name"]
    for name, info in options.items():
        prop = schema["properties"][name]
        assert prop["description"] == info.description, name
        if not info.is_required():
            assert prop["default"] == info.get_default(call_default_factory=True), name
    assert "api_key" not in schema["properties"]  # no secret is a parameter
    assert set(schema["properties"]["distribution"]["enum"]) >= {"default", "terminal_only"}
    effort = schema["properties"]["reasoning_effort"]["anyOf"][0]["enum"]
    assert effort[-2:] == ["max", "ultra"]


def test_nested_options_are_flat_and_defining_settings_come_from_the_fields():
    config = BatchConfig.from_options(
        dataset_file="d.jsonl", batch_size=2, run_name="r", model="m/x", max_turns=4, providers_allowed="a,b"
    )
    assert (
        config.llm.model == "m/x"
        and config.agent.max_turns == 4
        and config.llm.providers_allowed == ["a", "b"]
    )
    assert config.options()["providers_allowed"] == ["a", "b"] and config.options()["max_turns"] == 4
    assert BatchConfig.from_options(**config.options()) == config
    assert config.defining_settings() == {
        "distribution": "default", "seed": 0, "model": "m/x", "max_tokens": None, "reasoning_effort": None,
        "reasoning_disabled": False, "max_turns": 4, "ephemeral_system_prompt": None, "prefill_messages": [],
    }  # fmt: skip
    with pytest.raises(OptionError, match="invalid max_turns: Input should be greater than or equal to 1"):
        BatchConfig.from_options(dataset_file="d", batch_size=1, run_name="r", max_turns=0)
    with pytest.raises(OptionError, match="invalid nope: not an option"):
        BatchConfig.from_options(dataset_file="d", batch_size=1, run_name="r", nope=1)


def test_the_command_line_builds_the_same_config():
    args = build_run_parser().parse_args(
        [
            "--dataset_file=d.jsonl",
            "--batch_size",
            "3",
            "--run_name=r",
            "--max_turns=5",
            "--resume",
            "--seed=7",
        ]
    )
    config = config_from_args(args)
    assert (config.batch_size, config.agent.max_turns, config.resume, config.seed) == (3, 5, True, 7)


def test_settings_are_split_by_area_with_the_same_variable_names(monkeypatch):
    areas = [ModelEndpointSettings, SandboxSettings, LimitSettings, WebSettings, ImageSettings, VisionSettings,
             MoaSettings, BrowserSettings]  # fmt: skip
    names = [name for area in areas for name in area.model_fields]
    assert sorted(names) == sorted(HermesSettings.model_fields) and len(names) == len(set(names))
    monkeypatch.setenv("TERMINAL_TIMEOUT", "42")
    monkeypatch.setenv("HERMES_WEB_TIMEOUT", "7")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-area-test-123")
    settings = HermesSettings()
    assert settings.terminal_timeout == 42 and SandboxSettings().terminal_timeout == 42
    assert settings.web_timeout == 7 and settings.api_key.get_secret_value() == "sk-area-test-123"
