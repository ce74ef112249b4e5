"""The pilot (README § Run control): run N prompts drawn across the dataset, project the whole run from them.

``--pilot N`` draws N prompts (seeded by ``--seed``, spread over the whole dataset, not its head),
runs them as normal prompts of the run (their rows, tombstones and failures are the run's:
a later ``--resume`` does not pay for them again) and writes ``pilot.json``::

    {"prompts_drawn", "prompts_run", "total_prompts", "num_workers",
     "tokens_per_prompt": {"mean", "p90"}, "cost_per_prompt": {"mean", "p90"} | null,
     "duration_per_prompt_s": {"mean", "p90"}, "failure_rate", "discard_rate" (fractions),
     "tool_calls_per_prompt": {tool: mean calls}, "projection": {"prompts", "tokens",
     "cost_usd", "wall_time_s"}, "wall_time_s", "flow_run_id"}

It exits 0 (even when some drawn prompts failed: the failure rate is part of the report),
unless the spend cap was reached first (exit 3, ``pilot.json`` still written).

A prompt's cost includes the summary that compressed its row (``--compress_to_tokens``: the
pilot's rows are compressed like any run's). The projection multiplies the per-prompt means by
the dataset's size; the wall time is
``mean prompt duration x total prompts / num_workers`` (prompts in flight at once), which
assumes the pilot's latencies and no rate limit below ``num_workers``.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hermes_core.runfolder.folder import BATCH_RE, RunFolder
from hermes_core.runfolder.ledger import row_prompt_id
from hermes_core.runfolder.spend import Spend
from hermes_core.usage import Usage

T = TypeVar("T")


def draw(items: Sequence[T], n: int, seed: int) -> list[T]:
    """``n`` items (all when fewer; e.g. prompt indices) drawn without replacement with
    ``random.Random(seed)``, in dataset order."""
    if n >= len(items):
        return list(items)
    picked = random.Random(seed).sample(range(len(items)), n)
    return [items[i] for i in sorted(picked)]


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _stat(values: list[float], digits: int = 6) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": round(sum(values) / len(values), digits), "p90": round(_p90(values), digits)}


def report(config: Any, drawn: Collection[str], run_dir: Path, *, total_prompts: int, wall_s: float) -> dict:
    """``pilot.json`` of the drawn prompts, read from the run's ledger (see the module docstring).

    Reads only the ledger lines of the drawn prompts (rows by their ``prompt_id``, tombstones,
    failures), so a pilot that was resumed reports every drawn prompt that finished.
    """
    wanted = set(drawn)  # the drawn prompts' ids
    folder = RunFolder(run_dir)
    rows: dict[str, dict] = {}
    for path in sorted(p for p in Path(run_dir).iterdir() if BATCH_RE.match(p.name)):
        with open(path, "rb") as fh:
            for line in fh:
                pid = row_prompt_id(line)  # found without parsing; only the drawn rows are parsed
                if pid in wanted and pid not in rows:
                    rows[pid] = json.loads(line)
    tombs = {t["prompt_id"]: t for t in _jsonl(folder.discarded) if t.get("prompt_id") in wanted}
    fails = {f["prompt_id"]: f for f in _jsonl(folder.failures) if f.get("prompt_id") in wanted}
    fails = {pid: f for pid, f in fails.items() if pid not in rows and pid not in tombs}
    summaries = _summary_usage(folder, wanted)  # --compress_to_tokens: a row's summary is part of its cost
    usages = [
        Usage.total([Usage.from_dict(r["metadata"].get("usage")), summaries.get(pid)])
        for pid, r in rows.items()
    ]
    usages += [t.get("usage") for t in tombs.values()]
    usages += [f.get("usage") for f in fails.values()]
    price_in, price_out = config.price_per_mtok_in, config.price_per_mtok_out
    tokens, costs = [], []
    for usage in usages:
        one = Spend()
        one.add_usage(usage)
        tokens.append(one.total_tokens)
        cost = one.cost_usd(price_in, price_out)
        if cost is not None:
            costs.append(cost)
    durations = [float(r["metadata"].get("duration_s") or 0.0) for r in rows.values()]
    tools: dict[str, int] = {}
    for r in rows.values():
        for tool, counts in (r.get("tool_stats") or {}).items():
            tools[tool] = tools.get(tool, 0) + int(counts.get("count") or 0)
    ran = len(usages)
    mean_tokens = sum(tokens) / ran if ran else 0.0
    mean_cost = sum(costs) / len(costs) if costs else None
    mean_duration = sum(durations) / len(durations) if durations else 0.0
    return {
        "prompts_drawn": len(drawn),
        "prompts_run": ran,
        "total_prompts": total_prompts,
        "num_workers": config.num_workers,
        "seed": config.seed,
        "tokens_per_prompt": _stat(tokens, 1),
        "cost_per_prompt": _stat(costs),
        "duration_per_prompt_s": _stat(durations, 3),
        "failure_rate": round(len(fails) / ran, 4) if ran else None,
        "discard_rate": round(len(tombs) / ran, 4) if ran else None,
        "tool_calls_per_prompt": {t: round(c / len(rows), 3) for t, c in sorted(tools.items()) if c}
        if rows
        else {},
        "projection": {
            "prompts": total_prompts,
            "tokens": round(mean_tokens * total_prompts),
            "cost_usd": None if mean_cost is None else round(mean_cost * total_prompts, 4),
            "wall_time_s": round(mean_duration * total_prompts / max(1, config.num_workers), 1),
        },
        "wall_time_s": round(wall_s, 2),
    }


def summary_line(report: dict) -> str:
    """One line: ``pilot: 8 prompts ... projected for 1000 prompts: 1234567 tokens, $12.34, 3600 s at 16 workers``."""
    proj = report["projection"]
    cost = "cost n/a" if proj["cost_usd"] is None else f"${proj['cost_usd']:.4f}"
    tokens = report["tokens_per_prompt"] or {"mean": 0, "p90": 0}
    return (
        f"pilot: {report['prompts_run']} prompts run ({report['failure_rate'] or 0:.0%} failed, "
        f"{report['discard_rate'] or 0:.0%} discarded), {tokens['mean']:g} tokens per prompt "
        f"(p90 {tokens['p90']:g}); projected for {proj['prompts']} prompts: {proj['tokens']} tokens, {cost}, "
        f"{proj['wall_time_s']:g} s at {report['num_workers']} workers"
    )


def markdown(report: dict) -> str:
    """The pilot report as a markdown artifact."""
    proj = report["projection"]
    cost = report["cost_per_prompt"]
    tokens = report["tokens_per_prompt"] or {"mean": 0, "p90": 0}
    duration = report["duration_per_prompt_s"] or {"mean": 0, "p90": 0}
    lines = [
        "# Pilot",
        "",
        "| | per prompt (mean) | per prompt (p90) | projected for the dataset |",
        "|---|---|---|---|",
        f"| prompts | | | {proj['prompts']} ({report['prompts_run']} run in the pilot) |",
        f"| tokens | {tokens['mean']:g} | {tokens['p90']:g} | {proj['tokens']} |",
        f"| cost | {_usd(cost and cost['mean'], 6)} | {_usd(cost and cost['p90'], 6)} | {_usd(proj['cost_usd'], 4)} |",
        f"| duration | {duration['mean']:g} s | {duration['p90']:g} s | {proj['wall_time_s']:g} s"
        f" at {report['num_workers']} workers |",
        "",
        f"Failure rate {report['failure_rate'] or 0:.1%}, discard rate {report['discard_rate'] or 0:.1%}.",
        "",
        "Tool calls per prompt: "
        + (", ".join(f"{t} {c:g}" for t, c in report["tool_calls_per_prompt"].items()) or "none"),
    ]
    return "\n".join(lines) + "\n"


def _summary_usage(folder: RunFolder, wanted: set[str]) -> dict[str, Usage]:
    """prompt_id -> the usage of the summary that compressed its row (compression_metrics.json), for ``wanted``."""
    try:
        rows = json.loads(folder.compression_metrics.read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {
        r["prompt_id"]: Usage.from_dict(r["summariser_usage"])
        for r in rows
        if isinstance(r, dict) and r.get("prompt_id") in wanted and r.get("summariser_usage")
    }


def _usd(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"${value:.{digits}f}"


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


__all__ = ["draw", "markdown", "report", "summary_line"]
