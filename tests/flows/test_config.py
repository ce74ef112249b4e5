"""One declaration per option: the CLI's flags and the flow's parameters come from BatchConfig and its nested models."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import yaml
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import validate

from flows.cli import CLI_ONLY, build_run_parser, config_from_args, main
from flows.config import (
    UNSET_CHOICE,
    BatchConfig,
    OptionError,
    parameter_description,
    run_options,
    unset_choice_options,
)
from flows.generate import generate_trajectories
from hermes_core.dataset import read_dataset
from hermes_core.runfolder.run_info import RunStateError, check_run_dir, start_invocation
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
        assert prop["description"] == parameter_description(name), name
        assert parameter_description(name).startswith(info.description.rstrip(".")), name  # --help's text
        if name in unset_choice_options():
            assert prop["default"] == UNSET_CHOICE and info.default is None, name
        elif not info.is_required():
            assert prop["default"] == info.get_default(call_default_factory=True), name
    assert "api_key" not in schema["properties"]  # no secret is a parameter
    assert set(schema["properties"]["distribution"]["enum"]) >= {"default", "terminal_only"}
    effort = schema["properties"]["reasoning_effort"]["enum"]
    assert effort[-2:] == ["max", "ultra"]


REPO = Path(__file__).resolve().parents[2]
FIXED_VALUES = {
    "distribution",
    "keep",
    "provider_sort",
    "reasoning_effort",
    "terminal_env",
    "task_runner",
    "on_budget",
}
"""The options with a fixed set of values: dropdowns in the Prefect UI's run form."""


def _values(name: str) -> list[str]:
    """The values of option ``name`` as its type declares them (``Literal[...]``, maybe ``| None``)."""
    annotation = run_options()[name].annotation
    if typing.get_origin(annotation) is not typing.Literal:
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return list(typing.get_args(annotation))


def test_parameter_schema_has_dropdowns_and_plain_text_descriptions():
    for schema in (
        parameter_schema(generate_trajectories.fn).model_dump(),
        generate_trajectories.parameters.model_dump(),
    ):
        props = schema["properties"]
        choices = {name for name, prop in props.items() if "enum" in prop}
        assert choices == FIXED_VALUES
        assert set(unset_choice_options()) == {"provider_sort", "reasoning_effort", "terminal_env"}
        for name in FIXED_VALUES:
            prop = props[name]
            assert "anyOf" not in prop and prop["type"] == "string", name  # a dropdown, no type picker
            unset = [UNSET_CHOICE] if name in unset_choice_options() else []
            assert prop["enum"] == unset + _values(name), name
            assert prop["default"] in prop["enum"], name
        assert props["on_budget"]["enum"] == ["drain", "cancel"] and props["on_budget"]["default"] == "drain"
        assert props["task_runner"]["enum"] == ["threads", "dask"]
        assert props["terminal_env"]["enum"] == ["default", "local", "docker", "singularity", "modal"]
        for name, prop in props.items():  # the UI renders descriptions as markdown/HTML
            assert prop["description"] and not set("<>`*[]|") & set(prop["description"]), name
            assert "--" not in prop["description"], name  # options, not command-line flags
        assert "output_dir/run_name/" in props["run_name"]["description"]


def _deployments() -> list[dict]:
    return yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]


def test_what_the_run_form_sends_and_the_deployments_pass_the_servers_schema_check():
    schema = parameter_schema(generate_trajectories).model_dump()
    defaults = {name: prop["default"] for name, prop in schema["properties"].items() if "default" in prop}
    presets = sorted((REPO / "deployments" / "presets").glob("*.json"))
    assert presets
    for deployment in _deployments():
        # the UI's form sends every parameter: the deployment's values over the schema's defaults
        assert validate({**defaults, **deployment["parameters"]}, schema, raise_on_error=True) == []
        for preset in presets:
            values = {**deployment["parameters"], **json.loads(preset.read_text())}
            assert validate(values, schema, raise_on_error=True) == [], preset.name
    config = BatchConfig.from_options(dataset_file="d.jsonl", batch_size=2, run_name="r")
    assert validate(config.options(), schema, raise_on_error=True) == []  # create_flow_run_from_deployment
    chosen = {**config.options(), "terminal_env": "docker", "provider_sort": "price", "on_budget": "cancel"}
    assert validate(chosen, schema, raise_on_error=True) == []
    assert validate({**chosen, "on_budget": "later"}, schema)  # a value not in the list is refused
    assert validate({**chosen, "terminal_env": None}, schema)  # as a parameter, unset is "default"
    # the other optional options keep their int | None (str | None ...) picker: null is their unset
    assert validate({**chosen, "max_tokens": None, "pilot": None}, schema) == []


def test_default_means_unset_and_none_stays_possible():
    required = {"dataset_file": "d.jsonl", "batch_size": 1, "run_name": "r"}
    unset = BatchConfig.from_options(**required)
    assert (unset.terminal_env, unset.llm.provider_sort, unset.llm.reasoning_effort) == (None, None, None)
    explicit = BatchConfig.from_options(
        **required, terminal_env=None, provider_sort=None, reasoning_effort=None
    )
    spelled = BatchConfig.from_options(
        **required, terminal_env=UNSET_CHOICE, provider_sort=UNSET_CHOICE, reasoning_effort=UNSET_CHOICE
    )
    assert unset == explicit == spelled and spelled.settings_hash() == unset.settings_hash()
    assert spelled.defining_settings()["reasoning_effort"] is None
    options = unset.options()
    assert [options[name] for name in unset_choice_options()] == [UNSET_CHOICE] * 3
    assert BatchConfig.from_options(**options) == unset
    assert options["max_tokens"] is None and options["distribution"] == "default"  # a real distribution
    chosen = BatchConfig.from_options(**required, terminal_env="docker", reasoning_effort="none")
    assert (chosen.terminal_env, chosen.llm.reasoning_effort) == ("docker", "none")
    assert chosen.options()["terminal_env"] == "docker"
    # the flow itself (Prefect validates its parameters against the signature) takes both spellings
    flow_values = generate_trajectories.validate_parameters(
        {**required, "terminal_env": None, "provider_sort": "default"}
    )
    assert flow_values["terminal_env"] is None and flow_values["provider_sort"] == UNSET_CHOICE
    with pytest.raises(ParameterTypeError, match="terminal_env"):
        generate_trajectories.validate_parameters({**required, "terminal_env": "vm"})

    # the command line: the flag left out, or given as before
    def args(*flags: str):
        return build_run_parser().parse_args(["--dataset_file=d", "--batch_size=1", "--run_name=r", *flags])

    assert config_from_args(args()).terminal_env is None
    assert config_from_args(args("--terminal_env=docker", "--on_budget=cancel")).on_budget == "cancel"
    assert config_from_args(args("--provider_sort=latency")).llm.provider_sort == "latency"


@pytest.mark.parametrize(
    ("flag", "line"),
    [
        ("--on_budget=later", "error: invalid --on_budget: Input should be 'drain' or 'cancel' (got 'later')"),
        ("--task_runner=ray", "error: invalid --task_runner: Input should be 'threads' or 'dask' (got 'ray')"),
        (
            "--terminal_env=vm",
            "error: invalid --terminal_env: Input should be 'local', 'docker', 'singularity' or 'modal' (got 'vm')",
        ),
        (
            "--provider_sort=cheapest",
            "error: invalid --provider_sort: Input should be 'price', 'throughput' or 'latency' (got 'cheapest')",
        ),
        ("--reasoning_effort=huge", "error: invalid --reasoning_effort: Input should be 'none', 'minimal', 'low', "
         "'medium', 'high', 'xhigh', 'max' or 'ultra' (got 'huge')"),
    ],
)  # fmt: skip
def test_a_bad_value_of_a_fixed_set_is_one_clear_error_line(flag, line, capsys):
    assert main(["--dataset_file=d.jsonl", "--batch_size=1", "--run_name=r", flag]) == 2
    assert capsys.readouterr().err.strip() == line


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


def test_temperature_and_top_p_define_a_sample_only_once_set(tmp_path):
    """Unset, they are not in the defining settings: the identities of runs made before they existed stay."""
    base = {"dataset_file": "d", "batch_size": 1, "run_name": "r", "model": "m/x"}
    unset = BatchConfig.from_options(**base)
    assert "temperature" not in unset.defining_settings() and "top_p" not in unset.defining_settings()
    # the settings hash of this configuration before temperature and top_p existed (commit 968a029)
    assert unset.settings_hash() == "f6e41ff58fe33c3a"
    hot = BatchConfig.from_options(**base, temperature=1.0, top_p=0.95)
    assert hot.defining_settings()["temperature"] == 1.0 and hot.defining_settings()["top_p"] == 0.95
    assert hot.settings_hash() != unset.settings_hash()
    # a run made without them resumes without them, and refuses a temperature
    run = tmp_path / "run"
    run.mkdir()
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "p"}\n', encoding="utf-8")
    start_invocation(run, "r", unset.defining_settings(), unset.settings_hash(), read_dataset(dataset), None)
    check_run_dir(run, unset.defining_settings(), resume=True, overwrite=False)
    with pytest.raises(RunStateError, match=r"temperature: None -> 1.0"):
        check_run_dir(run, hot.defining_settings(), resume=True, overwrite=False)
    with pytest.raises(OptionError, match="invalid temperature"):
        BatchConfig.from_options(**base, temperature=3)


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


def test_stop_when_passed_does_not_define_a_sample():
    """A resume with or without --stop_when_passed continues the same run (the settings hash of before it existed)."""
    base = {"dataset_file": "d", "batch_size": 1, "run_name": "r", "model": "m/x"}
    stopping = BatchConfig.from_options(**base, samples_per_prompt=4, stop_when_passed=True)
    assert "stop_when_passed" not in stopping.defining_settings()
    assert BatchConfig.from_options(**base, stop_when_passed=True).settings_hash() == "f6e41ff58fe33c3a"
