"""The ``view``, ``export``, ``score`` and ``compress`` subcommands of ``hermes-batch``: argument parsing and dispatch.

``hermes-batch view data/<run> [--host 127.0.0.1] [--port 8765] [--dataset FILE]
[--allow_host NAME]`` serves the read-only viewer (any other ``Host`` header: 400);
``hermes-batch export data/<run> --out DIR [--format sharegpt|messages] [--include kept|all|passed]
[--compressed] [--license X] [--push_to_hub REPO_ID] [--overwrite]`` writes a Hugging Face dataset folder
(``--overwrite`` replaces only an earlier export, by its manifest; ``--compressed``: the rows of
``trajectories_compressed.jsonl``);
``hermes-batch score data/<run> [--scorer answer,judge,python:m:f] [--dataset FILE]
[--judge_model M] [--judge_base_url URL] [--judge_rubric_file F] [--num_workers N]`` scores the
rows again without the agent (:mod:`flows.rescore`);
``hermes-batch compress data/<run> --tokenizer T [--target_max_tokens N] ...`` compresses the rows to
a token budget (:mod:`flows.compress`). Both ``--flag=value`` and
``--flag value`` work. A bad argument or an unusable folder prints one line ``error: ...``
(naming the flag or file) and returns 2.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

__all__ = [
    "build_compress_parser",
    "build_export_parser",
    "build_score_parser",
    "build_view_parser",
    "run_command",
]


class CommandError(Exception):
    """A fatal input error of a subcommand: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise CommandError(message)


def build_view_parser() -> argparse.ArgumentParser:
    """Parser of ``hermes-batch view``."""
    p = _Parser(
        prog="hermes-batch view",
        description="Serve a read-only web viewer of a run folder (summary, prompt list, trajectories).",
    )
    p.add_argument("run_dir", help="the run folder, e.g. data/<run_name>")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)"
    )
    p.add_argument(
        "--port", type=int, default=8765, help="port to listen on (default: 8765; 0 = any free port)"
    )
    p.add_argument(
        "--dataset", help="the dataset file, when the path recorded in run.json does not lead to it"
    )
    p.add_argument(
        "--allow_host",
        action="append",
        default=[],
        metavar="NAME",
        help="another Host name to answer (repeatable; default: 127.0.0.1, localhost, [::1], the --host "
        "address, and this machine's names when bound to 0.0.0.0 or ::); any other Host gets 400",
    )
    return p


def build_export_parser() -> argparse.ArgumentParser:
    """Parser of ``hermes-batch export``."""
    p = _Parser(
        prog="hermes-batch export",
        description="Export a run's trajectories as Parquet shards with a Hugging Face dataset card.",
    )
    p.add_argument("run_dir", help="the run folder, e.g. data/<run_name>")
    p.add_argument(
        "--out",
        required=True,
        help="output folder (created; must be empty unless --overwrite; never in or around a run or output folder)",
    )
    p.add_argument(
        "--format",
        choices=("sharegpt", "messages"),
        default="sharegpt",
        help="sharegpt: rows as in trajectories.jsonl (default); messages: OpenAI chat messages + tools",
    )
    p.add_argument(
        "--include",
        choices=("kept", "all", "passed"),
        default="kept",
        help="kept: the rows of trajectories.jsonl (default); all: also the rows filtered for a hallucinated tool; "
        "passed: only the rows whose metadata.passed is true (after re-scores)",
    )
    p.add_argument(
        "--compressed",
        action="store_true",
        help="export the rows of trajectories_compressed.jsonl (hermes-batch compress) instead of "
        "trajectories.jsonl; with --include kept (all of them) or passed; the card names the token budget, "
        "the tokenizer and the totals",
    )
    p.add_argument("--license", help="license id for the dataset card (default: other)")
    p.add_argument(
        "--push_to_hub", metavar="REPO_ID", help="upload the folder to this Hugging Face dataset repo"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export in --out (deletes only the files its manifest lists)",
    )
    return p


def build_score_parser() -> argparse.ArgumentParser:
    """Parser of ``hermes-batch score``."""
    p = _Parser(
        prog="hermes-batch score",
        description="Score a run's existing rows again, without running the agent (never verify: its "
        "sandbox is gone). Results go to scores.jsonl beside the rows; trajectories.jsonl and "
        "statistics.json are merged again with the newest scores.",
    )
    p.add_argument("run_dir", help="the run folder, e.g. data/<run_name>")
    p.add_argument(
        "--scorer",
        default="auto",
        help="comma list: auto (answer for the records that have one), answer, judge, python:module:function",
    )
    p.add_argument(
        "--dataset",
        help="take each row's record (its answer) from this file, by prompt_index, instead of the row's copy",
    )
    p.add_argument("--judge_model", help="the judge's model (default: the run's model)")
    p.add_argument("--judge_base_url", help="the judge's endpoint (default: the run model's endpoint)")
    p.add_argument("--judge_rubric_file", help="text file with the judge's rubric (default: built in)")
    p.add_argument(
        "--num_workers", type=int, default=8, help="rows scored at once (judge requests in flight; default 8)"
    )
    return p


def run_score(argv: list[str]) -> int:
    """``hermes-batch score``: see :mod:`flows.rescore`. Returns the exit code."""
    args = build_score_parser().parse_args(argv)
    if args.num_workers < 1:
        raise CommandError(f"--num_workers {args.num_workers}: must be at least 1")
    if args.dataset and not Path(args.dataset).is_file():
        raise CommandError(f"--dataset {args.dataset}: no such file")
    from flows.rescore import main

    return main(args)


def build_compress_parser() -> argparse.ArgumentParser:
    """Parser of ``hermes-batch compress``."""
    from hermes_core.compression.tokens import DEFAULT_TOKENIZER

    p = _Parser(
        prog="hermes-batch compress",
        description="Compress a run's trajectories.jsonl to a token budget: the middle turns of a row over "
        "--target_max_tokens become one summary turn. Writes trajectories_compressed.jsonl and "
        "compression_metrics.json; cached per row in compression.jsonl (safe to kill and run again).",
    )
    p.add_argument("run_dir", help="the run folder, e.g. data/<run_name>")
    p.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        help="a tokenizer.json file (or a folder holding one) or a Hugging Face Hub id whose repo has one "
        f"(default: {DEFAULT_TOKENIZER}, the reference's; fetched from the Hub once, then from its cache)",
    )
    p.add_argument(
        "--target_max_tokens", type=int, default=15250, help="token budget of a row (default 15250)"
    )
    p.add_argument(
        "--protect_last_n_turns", type=int, default=4, help="last turns never compressed (default 4)"
    )
    p.add_argument("--summary_model", help="the summariser's model (default: the run's model)")
    p.add_argument("--summary_base_url", help="the summariser's endpoint (default: the run's endpoint)")
    p.add_argument(
        "--summary_target_tokens", type=int, default=750, help="length of a summary, tokens (default 750)"
    )
    p.add_argument(
        "--no_summary_notice",
        action="store_true",
        help="do not add the sentence saying earlier turns may be summarised to the system turn",
    )
    p.add_argument(
        "--drop_over_limit", action="store_true", help="leave rows still over the target out of the output"
    )
    p.add_argument(
        "--sample_percent",
        type=float,
        help="output only a seeded random sample of this share of the rows (0 < P <= 100), compressed",
    )
    p.add_argument("--seed", type=int, default=42, help="seed of --sample_percent (default 42)")
    p.add_argument(
        "--num_workers",
        type=int,
        default=8,
        help="rows compressed at once (summary requests in flight; default 8)",
    )
    return p


def run_compress(argv: list[str]) -> int:
    """``hermes-batch compress``: see :mod:`flows.compress`. Returns the exit code."""
    args = build_compress_parser().parse_args(argv)
    for name in ("target_max_tokens", "summary_target_tokens", "num_workers"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name} {getattr(args, name)}: must be at least 1")
    if args.protect_last_n_turns < 0:
        raise CommandError(f"--protect_last_n_turns {args.protect_last_n_turns}: must be 0 or more")
    if args.sample_percent is not None and not 0 < args.sample_percent <= 100:
        raise CommandError(f"--sample_percent {args.sample_percent:g}: must be more than 0 and at most 100")
    if not Path(args.run_dir).is_dir():
        raise CommandError(f"{args.run_dir}: no such run folder")
    from flows.compress import main

    return main(args)


def _check_port(host: str, port: int) -> int:
    """The port to listen on (a free one for 0), after checking that ``host:port`` can be bound."""
    if not 0 <= port <= 65535:
        raise CommandError(f"--port {port}: must be between 0 and 65535")
    try:
        with socket.create_server((host, port)) as sock:
            return sock.getsockname()[1]
    except OSError as exc:
        raise CommandError(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})"
        ) from None


def run_view(argv: list[str]) -> int:
    """``hermes-batch view``: build the index, then serve until Ctrl-C. Returns the exit code."""
    args = build_view_parser().parse_args(argv)
    from flows.viewer.index import RunIndexError

    if args.dataset and not Path(args.dataset).is_file():
        raise CommandError(f"--dataset {args.dataset}: no such file")
    port = _check_port(args.host, args.port)
    import uvicorn

    from flows.viewer.app import create_app
    from flows.viewer.index import RunIndex
    from hermes_core.tools import ALL_POSSIBLE_TOOLS

    try:
        index = RunIndex.open(
            Path(args.run_dir),
            valid_tools=ALL_POSSIBLE_TOOLS,
            dataset=Path(args.dataset) if args.dataset else None,
        )
    except RunIndexError as exc:
        raise CommandError(str(exc)) from None
    how = f"built in {index.build_seconds} s" if index.build_seconds else "from its cache"
    print(f"index of {index.table.height} prompts {how}", file=sys.stderr)
    app = create_app(Path(args.run_dir), index=index, host=args.host, allowed_hosts=args.allow_host)
    config = uvicorn.Config(app, host=args.host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    shown = "localhost" if args.host in {"127.0.0.1", "::1"} else args.host
    print(
        f"viewing {args.run_dir} at http://{shown}:{port}/ (read-only; Ctrl-C to stop)",
        file=sys.stderr,
    )
    server.run()
    return 0


def _default_output_dirs() -> list[Path]:
    """The default output folder (``output_dir``, ``data``) when it exists here and holds a run
    folder: ``--out`` may not be, hold or lie inside it (the exported run's parent always counts)."""
    from flows.config import BatchConfig
    from flows.viewer.export import is_run_folder

    folder = Path(BatchConfig.model_fields["output_dir"].default)
    try:
        held = any(is_run_folder(entry) for entry in folder.iterdir() if entry.is_dir())
    except OSError:
        held = False
    return [folder] if held else []


def run_export(argv: list[str]) -> int:
    """``hermes-batch export``: write the dataset folder, optionally upload it. Returns the exit code."""
    args = build_export_parser().parse_args(argv)
    from flows.viewer.export import ExportError, export_run
    from hermes_core.tools import ALL_POSSIBLE_TOOLS

    try:
        result = export_run(
            Path(args.run_dir),
            Path(args.out),
            fmt=args.format,
            include=args.include,
            license=args.license,
            overwrite=args.overwrite,
            valid_tools=ALL_POSSIBLE_TOOLS,
            output_dirs=_default_output_dirs(),
            compressed=args.compressed,
        )
    except ExportError as exc:
        raise CommandError(str(exc)) from None
    print(
        f"exported {result.rows} rows ({args.format}, {args.include}{', compressed' if args.compressed else ''}) "
        f"to {result.out_dir}: "
        f"{len(result.shards)} Parquet shards and README.md"
    )
    if args.push_to_hub:
        from flows.viewer.hub import HubError, push_folder

        try:
            url = push_folder(result.out_dir, args.push_to_hub)
        except HubError as exc:
            raise CommandError(f"--push_to_hub {args.push_to_hub}: {exc}") from None
        print(f"uploaded to {url}")
    return 0


def run_command(name: str, argv: list[str]) -> int:
    """Run the subcommand ``name`` (``view``, ``export``, ``score`` or ``compress``) with its arguments; returns the exit code."""
    commands = {"view": run_view, "export": run_export, "score": run_score, "compress": run_compress}
    try:
        return commands[name](argv)
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
