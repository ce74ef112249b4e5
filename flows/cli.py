"""Command line compatible with the reference ``batch_runner.py`` (README § Command line).

``python batch_runner.py --dataset_file=... --batch_size=... --run_name=...``
(or ``hermes-batch ...`` / ``hermes-batch run ...``) runs the
``generate-trajectories`` flow in this process; ``hermes-batch agent "PROMPT"``
runs one prompt through the agent and prints its trajectory row.

Prefect is imported only after the environment is prepared: with no
``PREFECT_API_URL`` the command line starts Prefect's local API for the run
(:mod:`flows.local_api`, in its own session) and sets safe defaults for it unless
the user set them. ``hermes-batch view``, ``export``, ``score`` and ``compress`` are in
:mod:`flows.commands`.

Exit codes: 0 every prompt finished (or a ``--pilot`` ran); 1 some prompts failed
(outputs written); 2 invalid input (nothing was sent to a model; e.g. a
``--max_cost_usd`` without any cost source); 3 the spend cap was reached
(``--max_cost_usd`` / ``--max_total_tokens``: no new prompt started, every output is
written, the flow run is Failed named ``BudgetReached``; raise the cap and ``--resume``);
130 the run was stopped (Ctrl-C, SIGTERM, SIGHUP or Cancel in Prefect: finished prompts are
saved, ``--resume`` continues).

A stop ends the command line within :data:`flows.stopping.STOP_DEADLINE_SECONDS`, whatever its
prompts are doing (:class:`flows.stopping.StopDeadline`).

The invocation holds its run folder's lock (:class:`hermes_core.runfolder.ledger.RunLock`) from the end of its
checks to its exit, lent to its flow: a second invocation on the same run exits 2 at once. The
local API it starts ends with it, however it ends (:mod:`flows.local_api`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import types
import typing
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError


class CliError(Exception):
    """A fatal input error: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, non-zero exit (reference bug: it exited 0)
        raise CliError(message)


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "y", "on"}:
        return True
    if lowered in {"0", "false", "no", "n", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _flag(parser: argparse.ArgumentParser | Any, name: str, help: str) -> None:
    """A boolean flag accepting ``--name``, ``--name=true`` and ``--name false``."""
    parser.add_argument(f"--{name}", type=_bool, nargs="?", const=True, default=None, help=help)


def _add_option(group: Any, name: str, info: Any) -> None:
    """One ``--name`` flag from a run option's pydantic field (type, choices, description, default)."""
    annotation = info.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = args[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) else annotation
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    shown = "required" if info.is_required() else f"default: {default}"
    help_text = (
        f"{info.description} ({shown})"
        if default not in (None, False) or info.is_required()
        else info.description
    )
    if kind is bool:
        _flag(group, name, help_text)
        return
    choices = list(typing.get_args(kind)) if typing.get_origin(kind) is typing.Literal else []
    metavar = "{" + ",".join(choices) + "}" if 0 < len(choices) <= 8 else name.upper()
    convert = kind if kind in (int, float) else str
    group.add_argument(f"--{name}", type=convert, metavar=metavar, help=help_text)  # pydantic checks choices


REFERENCE_FLAGS = frozenset(
    "dataset_file batch_size run_name distribution model base_url max_turns num_workers resume verbose "
    "max_samples max_tokens providers_allowed providers_ignored providers_order provider_sort "
    "reasoning_effort reasoning_disabled ephemeral_system_prompt log_prefix_chars prefill_messages_file".split()
)
"""The reference batch_runner.py's flags (README § Command line), listed first in --help."""


def build_run_parser() -> argparse.ArgumentParser:
    """The parser of a batch run: one flag per run option (:func:`flows.config.run_options`), plus the
    command line's own ``--api_key`` and ``--list_distributions``."""
    from flows.config import run_options

    p = _Parser(
        prog=os.path.basename(sys.argv[0]) or "batch_runner.py",
        description="Run the Hermes agent over a JSONL dataset and write ShareGPT trajectories to data/<run_name>/.",
        epilog='One prompt, trajectory row printed: hermes-batch agent "PROMPT" --model mock/scripted --toolsets terminal,file',
    )
    ref = p.add_argument_group("reference flags")
    ours = p.add_argument_group("hermes-batch flags")
    for name, info in run_options().items():
        _add_option(ref if name in REFERENCE_FLAGS else ours, name, info)
    ref.add_argument(
        "--api_key",
        help="API key (default: OPENROUTER_API_KEY, then OPENAI_API_KEY); kept in memory, never stored",
    )
    _flag(ref, "list_distributions", "print the toolset distributions and exit")
    return p


def build_agent_parser() -> argparse.ArgumentParser:
    """The parser of ``hermes-batch agent PROMPT``: one prompt, trajectory row printed."""
    p = _Parser(
        prog="hermes-batch agent",
        description="Run one prompt through the agent and print its trajectory row.",
    )
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--model", default="mock/scripted", help="model id (default: mock/scripted)")
    p.add_argument(
        "--base_url", help="OpenAI-compatible endpoint (default: built-in server for mock/, else OpenRouter)"
    )
    p.add_argument(
        "--toolsets", default="terminal,file", help="comma list of toolsets (default: terminal,file)"
    )
    p.add_argument("--max_turns", type=int, default=10, help="max model calls (default: 10)")
    p.add_argument("--terminal_env", help="sandbox backend (default: TERMINAL_ENV, else local)")
    p.add_argument("--cwd", help="working directory of the terminal (default: a fresh temporary folder)")
    p.add_argument("--prompt_timeout", type=float, help="wall-clock seconds for the prompt")
    _flag(p, "verbose", "log tool calls and results")
    return p


CLI_ONLY = frozenset({"api_key", "list_distributions"})
"""Flags of the command line that are not run options."""


def config_from_args(args: argparse.Namespace) -> Any:
    """Build the run's :class:`~flows.config.BatchConfig` from parsed flags (unset flags take the defaults).

    Raises:
        CliError: a missing required flag or an invalid value (the message names the flag).
    """
    from flows.config import BatchConfig, OptionError

    values = {k: v for k, v in vars(args).items() if v is not None and k not in CLI_ONLY}
    missing = [f"--{name}" for name in ("dataset_file", "batch_size", "run_name") if name not in values]
    if missing:
        raise CliError(f"missing required flag(s): {', '.join(missing)}")
    try:
        return BatchConfig.from_options(**values).for_date(datetime.now(UTC).date())
    except OptionError as exc:
        raise CliError(f"invalid --{exc.option}: {exc.reason}") from None


def _prefect_local_api() -> Any:
    """With no ``PREFECT_API_URL``, start Prefect's local API for this run (:class:`flows.local_api.LocalAPI`).

    Safe defaults (analytics off, the server settings of :mod:`flows.tuning`) are set only where
    the user has not set them.

    Returns:
        The started :class:`~flows.local_api.LocalAPI` (stop it at the end), or None when
        ``PREFECT_API_URL`` names a server.
    """
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if os.environ.get("PREFECT_API_URL"):
        return None
    from flows.local_api import LocalAPI
    from flows.tuning import apply_prefect_server_defaults

    apply_prefect_server_defaults()
    print(
        "No PREFECT_API_URL set: starting a local Prefect API for this run (takes 10-30 s).", file=sys.stderr
    )
    api = LocalAPI()
    try:
        os.environ["PREFECT_API_URL"] = api.start()
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    return api


def preflight(config: Any, api_key: str | None = None) -> int:
    """Checks that need no Prefect and no model: dataset (records' ``cwd`` included), run folder rules, API key.

    Run before the local API starts and before any request: a dataset ``cwd`` the local sandbox
    refuses (:func:`hermes_core.runfolder.run_info.check_cwds`: ``/proc``, a home, the run or output folder...)
    is an error naming the file and each line.

    Returns:
        The number of valid records.

    Raises:
        CliError: with the first problem found.
    """
    from hermes_core.dataset import DatasetError, read_dataset
    from hermes_core.endpoints import require_key, resolve_backend, resolve_base_url
    from hermes_core.exceptions import ConfigError
    from hermes_core.runfolder.run_info import RunStateError, check_cwds, check_run_dir
    from hermes_core.settings import HermesSettings

    settings = HermesSettings()
    try:
        dataset = read_dataset(
            config.dataset_file, max_samples=config.max_samples, skip_invalid=config.skip_invalid, reuse=True
        )
    except DatasetError as exc:
        raise CliError(str(exc)) from None
    try:
        check_cwds(
            config, dataset, settings
        )  # the flow's read-dataset task checks the same; nothing has started yet
    except DatasetError as exc:
        raise CliError(str(exc)) from None
    for line, reason in dataset.invalid:
        print(f"warning: skipping line {line} of {config.dataset_file}: {reason}", file=sys.stderr)
    if config.run_dir.is_dir():  # run_batch takes the lock for real; this only fails before the checks below
        from hermes_core.runfolder.ledger import RunInUseError, RunLock

        try:
            with RunLock(config.run_dir):
                pass
        except RunInUseError as exc:
            raise CliError(str(exc)) from None
    if not config.overwrite:
        try:
            check_run_dir(config.run_dir, config.defining_settings(), resume=config.resume, overwrite=False)
        except RunStateError as exc:
            raise CliError(str(exc)) from None
    if not config.api_key_secret and not api_key:  # a Secret block is read by the flow
        base = resolve_base_url(config.model, config.base_url, settings, start_mock=False)
        try:
            require_key(base, settings.api_key)
        except ConfigError as exc:
            raise CliError(str(exc)) from None
    if config.compress_to_tokens:  # a tokenizer that does not load fails now, not after the prompts
        from hermes_core.compression import TokenizerError, load_tokenizer

        try:
            load_tokenizer(config.tokenizer)
        except TokenizerError as exc:
            raise CliError(str(exc)) from None
    backend = resolve_backend(config.terminal_env, settings)
    from hermes_core.environments.isolation import isolation_refusal

    refusal = isolation_refusal(backend, settings)
    if refusal:  # local commands in a container without bubblewrap
        raise CliError(refusal)
    if backend == "docker":  # one line, not one per prompt
        from hermes_core.environments.docker_engine import EngineUnavailable, ping_engine

        try:
            ping_engine()
        except EngineUnavailable as exc:
            raise CliError(str(exc)) from None
    return len(dataset.records)


def run_batch(argv: list[str]) -> int:
    """The batch command: parse, validate, run the flow, print the summary. Returns the exit code."""
    args = build_run_parser().parse_args(argv)
    if args.list_distributions:
        from hermes_core.distributions import format_distributions

        print(format_distributions(), end="")
        return 0
    config = config_from_args(args)
    if args.api_key and config.task_runner == "dask":
        raise CliError(
            "--api_key cannot reach Dask worker processes (it is never put in the environment): "
            "set OPENROUTER_API_KEY / OPENAI_API_KEY or use --api_key_secret"
        )
    from flows.stopping import StopDeadline, interrupt_on_stop_signals

    # a stop signal before or after the flow: exit 130, API stopped; and whatever a prompt does, the
    # process ends STOP_DEADLINE_SECONDS after a stop at the latest
    with StopDeadline(), interrupt_on_stop_signals():
        preflight(config, args.api_key)
        with _hold_run_folder(config.run_dir):
            api = _prefect_local_api()  # sets PREFECT_API_URL: Prefect must not be imported before it
            if api is not None and config.concurrency_limit:
                print(
                    f"warning: --concurrency_limit {config.concurrency_limit} is on this command's own local "
                    "Prefect API: no other run sees it. Set PREFECT_API_URL to the shared server so that "
                    "runs share the limit",
                    file=sys.stderr,
                )
            try:
                if args.api_key:
                    from tasks.prompt import provide_api_key  # imports Prefect

                    provide_api_key(args.api_key)  # in memory only: never a parameter, never in os.environ
                return _run_flow(config, heartbeats=api is None)
            finally:
                if api is not None:
                    from flows.prefect_adapter import drain_log_and_event_workers

                    try:
                        drain_log_and_event_workers()
                    finally:
                        api.stop()


@contextlib.contextmanager
def _hold_run_folder(run_dir: Any) -> typing.Iterator[None]:
    """Hold the run folder's lock for the whole invocation, lent to the flow this process runs.

    Taken before the local API starts (10-30 s), so a second invocation on the same run is
    refused at once with exit code 2, and cannot take the folder from under this one.

    Raises:
        CliError: another invocation holds the folder.
    """
    from hermes_core.runfolder.ledger import RunInUseError, RunLock

    try:
        lock = RunLock(run_dir, lend=True).__enter__()
    except RunInUseError as exc:
        raise CliError(str(exc)) from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def _run_flow(config: Any, heartbeats: bool = True) -> int:
    """Run the flow in this process with the live progress display; print the summary; the exit code.

    ``heartbeats`` False: no flow-run heartbeats (:func:`flows.tuning.without_flow_heartbeats`),
    for the local API the command line started itself.
    """
    if config.verbose:
        import logging

        logging.getLogger("hermes_core").setLevel(logging.DEBUG)
    from flows.budget import BUDGET_REACHED
    from flows.console import LiveProgress, print_summary
    from flows.generate import generate_trajectories
    from flows.tuning import without_flow_heartbeats

    with (
        LiveProgress(verbose=config.verbose),
        contextlib.nullcontext() if heartbeats else without_flow_heartbeats(),
    ):
        state = generate_trajectories(**config.options(), return_state=True)
    print_summary(config, state)
    if state.name == BUDGET_REACHED:
        return EXIT_BUDGET
    if state.is_completed():
        return 0
    return 130 if state.is_cancelled() else 1


EXIT_BUDGET = 3
"""Exit code of a run that reached its spend cap."""


def run_agent(argv: list[str]) -> int:
    """The ``agent`` command: one prompt, trajectory row printed as JSON. Returns the exit code."""
    args = build_agent_parser().parse_args(argv)
    import logging

    from hermes_core.agent import AgentConfig
    from hermes_core.client import ModelOptions
    from hermes_core.exceptions import HermesError
    from hermes_core.runner import PromptJob, RunSpec, run_prompt

    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
    try:
        spec = RunSpec(
            run_name="agent",
            model=ModelOptions(model=args.model),
            agent=AgentConfig(max_turns=args.max_turns),
            base_url=args.base_url,
            prompt_timeout=args.prompt_timeout,
            terminal_env=args.terminal_env,
            toolsets=[t.strip() for t in args.toolsets.split(",") if t.strip()],
        )
        job = PromptJob(
            prompt_index=0,
            prompt_id=hashlib.sha256(args.prompt.encode()).hexdigest()[:32],
            record_key=hashlib.sha256(args.prompt.encode()).hexdigest()[:32],
            prompt=args.prompt,
            cwd=args.cwd,
        )
        outcome = run_prompt(job, spec)
    except (HermesError, KeyError, ValidationError) as exc:
        raise CliError(f"{type(exc).__name__}: {exc}") from None
    print(json.dumps(outcome.row, ensure_ascii=False, indent=2))
    if outcome.status != "kept":
        print(f"note: this sample would be discarded in a batch run ({outcome.status})", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``hermes-batch`` and ``batch_runner.py``."""
    from flows.tuning import limit_malloc_arenas

    limit_malloc_arenas()  # before any thread exists (glibc fixes its arena limit early)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["agent"]:
            return run_agent(argv[1:])
        if argv[:1] in (["view"], ["export"], ["score"], ["compress"]):
            from flows.commands import run_command

            return run_command(argv[0], argv[1:])
        if argv[:1] == ["run"]:
            argv = argv[1:]
        return run_batch(argv)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished prompts are saved; run again with --resume to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["main"]
