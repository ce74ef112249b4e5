"""The run's statistics and artifacts: the ``compute-statistics`` and ``publish-artifacts`` tasks.

``compute-statistics`` writes ``statistics.json`` (counts, tool usage, reasoning coverage,
tokens, cost, plus the run-control figures: budget and concurrency). ``publish-artifacts`` makes
the Prefect artifacts a person looks at in the UI: the tool-usage table, the summary markdown
and, when prompts failed in this flow run, a table of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run

from hermes_core.compression import describe_compression
from hermes_core.runfolder.early_stop import stopped_statistics
from hermes_core.runfolder.folder import RunFolder
from hermes_core.runfolder.postprocess import MergeResult, compute_statistics, write_json_atomic
from hermes_core.scoring import describe_pass_at_k, describe_scores
from hermes_core.tools import ALL_POSSIBLE_TOOLS


def artifact_key(run_name: str, suffix: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for a run, e.g. ``my-run-summary``."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_name}-{suffix}".lower()).strip("-")


def first_line(message: str, limit: int = 160) -> str:
    """The first line of ``message``, cut to ``limit`` characters (an ellipsis marks a cut)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


@task(name="compute-statistics", persist_result=False)
def statistics_task(
    config,
    merge: MergeResult,
    index_of: Mapping[str, int],
    duration: float,
    failed: list[str],
    run_control: dict | None = None,
    samples_skipped: int | None = None,
) -> dict:
    """Statistics of the whole run, written to ``<run>/statistics.json`` and returned.

    Args:
        config: the run's :class:`~flows.config.BatchConfig`.
        merge: what the merge wrote (its counts go into the statistics).
        index_of: prompt_id -> prompt_index of the current dataset.
        duration: seconds over every invocation of the run.
        failed: prompt_ids that failed in this flow run.
        run_control: extra top-level keys (``budget``, ``concurrency``), added as they are.
        samples_skipped: with ``--stop_when_passed``, the samples held back (None without it).

    Returns:
        The dict of :func:`hermes_core.runfolder.postprocess.compute_statistics` plus ``run_control``;
        with ``samples_skipped``, plus ``stopped_when_passed`` and, when samples were skipped, the
        ``pass_at_k`` and ``pass_hat_k`` of :func:`hermes_core.runfolder.early_stop.stopped_statistics`.
    """
    stats = compute_statistics(
        config.run_dir,
        merge=merge,
        run_name=config.run_name,
        distribution=config.distribution,
        model=config.model,
        batch_size=config.batch_size,
        index_of=index_of,
        duration_seconds=duration,
        failed_prompt_ids=failed,
        valid_tools=ALL_POSSIBLE_TOOLS,
        flow_run_id=str(flow_run.id) if flow_run.id else None,
        samples_per_prompt=config.samples_per_prompt,
        scorers=config.scorer.split(","),
    )
    stats.update(run_control or {})
    if samples_skipped is not None:
        folder = RunFolder(config.run_dir)
        rows = [merge.path, *([folder.rejected] if merge.rejected else [])]
        stats.update(stopped_statistics(rows, config.samples_per_prompt, samples_skipped))
    write_json_atomic(RunFolder(config.run_dir).statistics, stats)
    return stats


@task(name="publish-artifacts", persist_result=False)
def publish_task(config, stats: dict[str, Any], failed: list[dict[str, Any]], warnings: list[str]) -> None:
    """Table artifacts of tool statistics and (when prompts failed) of the failed prompts; a markdown summary.

    Args:
        config: the run's :class:`~flows.config.BatchConfig`.
        stats: what :func:`statistics_task` returned.
        failed: this flow run's failures (``{prompt_index, error_type, message, attempts}``).
        warnings: lines added to the summary as warnings (isolation, network).
    """
    rows = [
        {"tool": tool, **values}
        for tool, values in sorted(stats["tool_statistics"].items(), key=lambda kv: (-kv[1]["count"], kv[0]))
    ]
    create_table_artifact(
        table=rows,
        key=artifact_key(config.run_name, "tool-stats"),
        description=f"Tool usage of run {config.run_name}",
    )
    markdown = summary_markdown(config, stats) + "".join(f"\n> **Warning:** {w}\n" for w in warnings)
    create_markdown_artifact(markdown=markdown, key=artifact_key(config.run_name, "summary"))
    if failed:
        create_table_artifact(
            table=[
                {
                    "prompt_index": f["prompt_index"],
                    "error_type": f["error_type"],
                    "kind": f.get("kind", "model"),
                    "message": first_line(f["message"]),
                    "attempts": f["attempts"],
                }
                for f in sorted(failed, key=lambda f: f["prompt_index"])
            ],
            key=artifact_key(config.run_name, "failures"),
            description=f"Prompts of {config.run_name} that failed in this flow run: a Retry re-attempts only these",
        )


def _left_out(merge: dict[str, int]) -> list[str]:
    """Summary rows for what the merge left out besides hallucinated rows (none when nothing was)."""
    labels = {
        "duplicates_dropped": "duplicate rows dropped",
        "orphaned": "rows of records no longer in the dataset",
        "torn_lines": "unreadable lines (a killed writer's torn line)",
    }
    return [f"| {labels[key]} | {count} |" for key, count in merge.items() if count and key in labels]


def describe_stopped(figures: dict[str, Any]) -> str:
    """``5 samples skipped; saved about 15 model requests and $0.0012 (estimates: skipped x the mean per row)``
    from statistics.json's ``stopped_when_passed`` (the cost only when rows report one)."""
    cost = figures.get("cost_saved_usd_estimate")
    saved = f"{figures['requests_saved_estimate']:g} model requests" + (
        "" if cost is None else f" and ${cost:.4f}"
    )
    return (
        f"{figures['samples_skipped']} samples skipped; saved about {saved} "
        "(estimates: skipped x the mean per row)"
    )


def summary_markdown(config, stats: dict[str, Any]) -> str:
    """The run summary as markdown (counts, reasoning coverage, scores, discards, failures, tokens, cost, duration)."""
    reasoning = stats["reasoning_statistics"]
    tokens = stats["tokens"]
    cost = stats.get("cost_usd")
    lines = [
        f"# Run `{config.run_name}`",
        "",
        "| | |",
        "|---|---|",
        f"| model | `{config.model}` |",
        f"| distribution | {config.distribution} |",
        f"| prompts | {stats['total_prompts']} |",
        f"| trajectories written | {stats['completed']} |",
        f"| discarded (no reasoning) | {stats['discarded_no_reasoning']} |",
        f"| filtered (hallucinated tool) | {stats['filtered_hallucinated']} |",
        f"| failed | {stats['failed']} |",
        f"| reasoning coverage | {reasoning['turns_with_reasoning']}/{reasoning['total_assistant_turns']}"
        f" assistant turns ({reasoning['coverage_percent']}%) |",
        *([f"| scores | {describe_scores(stats['scores'])} |"] if stats.get("scores") else []),
        *(
            [f"| pass@k | {describe_pass_at_k(stats['pass_at_k'], stats.get('pass_hat_k'))} |"]
            if stats.get("pass_at_k")
            else []
        ),
        *(
            [f"| compression | {describe_compression(stats['compression'])} |"]
            if stats.get("compression")
            else []
        ),
        *(
            [f"| stopped when passed | {describe_stopped(stats['stopped_when_passed'])} |"]
            if stats.get("stopped_when_passed")
            else []
        ),
        f"| tokens | {tokens['prompt']} prompt, {tokens['completion']} completion, {tokens['reasoning']} reasoning |",
        f"| cost | {'n/a' if cost is None else f'${cost:.4f}'} |",
        f"| duration | {stats['duration_seconds']} s |",
        f"| output | `{RunFolder(config.run_dir).trajectories}` |",
        *_left_out(stats.get("merge") or {}),
        f"| view it | `hermes-batch view {config.run_dir}` |",
    ]
    return "\n".join(lines) + "\n"
