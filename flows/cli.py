"""Command line compatible with the reference ``batch_runner.py`` (SPEC section 3).

``python batch_runner.py --dataset_file=... --batch_size=... --run_name=...``
(or ``hermes-batch ...`` / ``hermes-batch run ...``) runs the
``generate-trajectories`` flow in this process; ``hermes-batch agent "PROMPT"``
runs one prompt through the agent and prints its trajectory row.

Prefect is imported only after the environment is prepared: with no
``PREFECT_API_URL`` the flow runs on Prefect's local (ephemeral) API, and this
module sets safe defaults for it unless the user set them.

Exit codes: 0 every prompt finished; 1 some prompts failed (outputs written);
2 invalid input (nothing was sent to a model).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"


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


def _flag(parser: argparse.ArgumentParser, name: str, help: str) -> None:
    """A boolean flag accepting ``--name``, ``--name=true`` and ``--name false``."""
    parser.add_argument(f"--{name}", type=_bool, nargs="?", const=True, default=None, help=help)


def build_run_parser() -> argparse.ArgumentParser:
    """The parser of a batch run: every reference flag (same names and defaults) plus ours."""
    p = _Parser(
        prog=os.path.basename(sys.argv[0]) or "batch_runner.py",
        description="Run the Hermes agent over a JSONL dataset and write ShareGPT trajectories to data/<run_name>/.",
        epilog='One prompt, trajectory row printed: hermes-batch agent "PROMPT" --model mock/scripted --toolsets terminal,file',
    )
    ref = p.add_argument_group("reference flags")
    ref.add_argument("--dataset_file", help="JSONL dataset path (required)")
    ref.add_argument("--batch_size", type=int, help="prompts per batch file / checkpoint (required, >= 1)")
    ref.add_argument("--run_name", help="output folder data/<run_name>/ (required)")
    ref.add_argument("--distribution", help="toolset distribution (default: default)")
    ref.add_argument(
        "--model", help="model id (default: anthropic/claude-sonnet-4.6; mock/... = offline model)"
    )
    ref.add_argument("--base_url", help=f"OpenAI-compatible endpoint (default: {DEFAULT_BASE_URL})")
    ref.add_argument(
        "--api_key", help="API key (default: OPENROUTER_API_KEY, then OPENAI_API_KEY); never stored"
    )
    ref.add_argument("--max_turns", type=int, help="max model calls per prompt (default: 10)")
    ref.add_argument("--num_workers", type=int, help="prompts in flight at once (default: 4)")
    _flag(ref, "resume", "continue an existing run")
    _flag(ref, "verbose", "detailed logs")
    _flag(ref, "list_distributions", "print the toolset distributions and exit")
    ref.add_argument("--max_samples", type=int, help="only the first N valid records (default: all)")
    ref.add_argument("--max_tokens", type=int, help="tokens per response (default: model default)")
    ref.add_argument("--providers_allowed", help="comma list -> OpenRouter provider.only")
    ref.add_argument("--providers_ignored", help="comma list -> OpenRouter provider.ignore")
    ref.add_argument("--providers_order", help="comma list -> OpenRouter provider.order")
    ref.add_argument("--provider_sort", help="price, throughput or latency -> provider.sort")
    ref.add_argument("--reasoning_effort", help="none, minimal, low, medium, high or xhigh")
    _flag(ref, "reasoning_disabled", "disable reasoning tokens (wins over --reasoning_effort)")
    ref.add_argument("--ephemeral_system_prompt", help="system prompt sent to the model, never stored")
    ref.add_argument(
        "--log_prefix_chars", type=int, help="preview length of tool calls/results in logs (default: 100)"
    )
    ref.add_argument(
        "--prefill_messages_file", help="JSON array of {role, content} few-shot messages, never stored"
    )
    ours = p.add_argument_group("hermes-batch flags")
    ours.add_argument("--prompt_timeout", type=float, help="wall-clock seconds per prompt (default: none)")
    _flag(ours, "overwrite", "delete an existing run's outputs and start again")
    _flag(ours, "skip_invalid", "skip invalid dataset lines with a warning instead of refusing to start")
    ours.add_argument(
        "--terminal_env", help="sandbox backend: local, docker, singularity, modal (default: TERMINAL_ENV)"
    )
    ours.add_argument("--seed", type=int, help="seed of the per-prompt toolset draw (default: 0)")
    ours.add_argument("--output_dir", help="parent folder of run folders (default: data)")
    ours.add_argument(
        "--retries", type=int, help="Prefect task retries after a transient failure (default: 1)"
    )
    ours.add_argument("--api_key_secret", help="name of a Prefect Secret block holding the API key")
    ours.add_argument("--task_runner", help="where prompt tasks run: threads (default) or dask")
    ours.add_argument(
        "--dask_address", help="Dask scheduler for --task_runner=dask (default: a local cluster)"
    )
    ours.add_argument("--dask_workers", type=int, help="processes of the local Dask cluster (default: 2)")
    ours.add_argument(
        "--result_storage", help="task result cache folder (default: data/<run_name>/.prefect-results)"
    )
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


def config_from_args(args: argparse.Namespace) -> Any:
    """Build the run's :class:`~flows.config.BatchConfig` from parsed flags (unset flags take the defaults).

    Raises:
        CliError: a missing required flag or an invalid value (the message names the flag).
    """
    from flows.config import BatchConfig

    values = {
        k: v for k, v in vars(args).items() if v is not None and k not in {"api_key", "list_distributions"}
    }
    missing = [f"--{name}" for name in ("dataset_file", "batch_size", "run_name") if name not in values]
    if missing:
        raise CliError(f"missing required flag(s): {', '.join(missing)}")
    try:
        return BatchConfig(**values).for_date(datetime.now(UTC).date())
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "arguments"
        raise CliError(f"invalid --{field}: {first['msg']}") from None
    except ValueError as exc:  # prefill file problems
        raise CliError(str(exc)) from None


def _prefect_local_defaults() -> bool:
    """Safe defaults for Prefect's local API, set only when the user has not set them.

    Returns:
        True when the run uses Prefect's local (ephemeral) API.
    """
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if os.environ.get("PREFECT_API_URL"):
        return False
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    from flows.tuning import apply_prefect_server_defaults

    apply_prefect_server_defaults()
    print(
        "No PREFECT_API_URL set: starting a local Prefect API for this run (takes 10-30 s).", file=sys.stderr
    )
    return True


def _stop_now_on_ctrl_c() -> None:
    """Local mode: Ctrl-C cancels every prompt, stops the local API and exits 130 at once.

    The terminal's Ctrl-C also reaches Prefect's local API server (same process group), so
    Prefect's own crash bookkeeping would only retry against a dead server for minutes.
    Every finished prompt is already on disk (rows are fsynced as they arrive). The signal
    is taken from a wake-up pipe by a watcher thread, so it acts even while the main thread
    is blocked inside a library call.
    """
    import signal
    import threading

    import psutil

    from hermes_core.cancel import cancel_running

    def stop() -> None:
        cancel_running()  # kills the prompts' commands and tears their sandboxes down
        for child in psutil.Process().children(recursive=True):
            child.kill()
        os.write(2, b"\ninterrupted: finished prompts are saved; run again with --resume to continue\n")
        os._exit(130)

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def watch() -> None:
        while True:
            if signal.SIGINT in os.read(read_end, 64):
                stop()

    signal.signal(
        signal.SIGINT, lambda signum, frame: None
    )  # the watcher acts; Python just must not ignore it
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=watch, name="ctrl-c-watcher", daemon=True).start()


def preflight(config: Any) -> int:
    """Checks that need no Prefect and no model: dataset, run folder rules, API key.

    Returns:
        The number of valid records.

    Raises:
        CliError: with the first problem found.
    """
    from hermes_core.mockllm import is_mock_model
    from hermes_core.settings import HermesSettings
    from tasks.dataset import DatasetError, read_dataset
    from tasks.run_setup import RunStateError, check_run_dir

    try:
        dataset = read_dataset(
            config.dataset_file, max_samples=config.max_samples, skip_invalid=config.skip_invalid
        )
    except DatasetError as exc:
        raise CliError(str(exc)) from None
    for line, reason in dataset.invalid:
        print(f"warning: skipping line {line} of {config.dataset_file}: {reason}", file=sys.stderr)
    if config.run_dir.is_dir():  # the flow takes the lock for real; this only fails early and clearly
        from tasks.ledger import RunInUseError, RunLock

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
    needs_key = not is_mock_model(config.model) and not config.api_key_secret
    base = config.base_url or DEFAULT_BASE_URL
    if (
        needs_key
        and "://127.0.0.1" not in base
        and "://localhost" not in base
        and not HermesSettings().api_key
    ):
        raise CliError(f"no API key for {base}: set OPENROUTER_API_KEY or OPENAI_API_KEY, or pass --api_key")
    if (config.terminal_env or HermesSettings().terminal_env) == "docker":  # one line, not one per prompt
        from hermes_core.environments.docker import EngineUnavailable, ping_engine

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
    if args.api_key:
        os.environ["OPENROUTER_API_KEY"] = (
            args.api_key
        )  # reaches the tasks through the environment, never a parameter
    config = config_from_args(args)
    total = preflight(config)
    if _prefect_local_defaults():
        _stop_now_on_ctrl_c()
    if config.verbose:
        import logging

        logging.getLogger("hermes_core").setLevel(logging.DEBUG)
    from flows.console import LiveProgress, print_summary
    from flows.generate import generate_trajectories

    with LiveProgress(total):
        state = generate_trajectories(config=config, return_state=True)
    print_summary(config, state)
    return 0 if state.is_completed() else 1


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
            prompt=args.prompt,
            cwd=args.cwd,
        )
        outcome = run_prompt(job, spec)
    except (HermesError, KeyError, ValidationError) as exc:
        raise CliError(f"{type(exc).__name__}: {exc}") from None
    print(json.dumps(outcome.row, ensure_ascii=False, indent=2))
    if outcome.status != "completed":
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
        if argv[:1] in (["view"], ["export"]):
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
