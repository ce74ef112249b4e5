"""Where a slot's time goes: summary of a ``timeline`` patch file (bench/_flow_child.py).

Reads the JSON the patch writes (``HERMES_BENCH_TIMELINE``): the ``(start, end)`` of every
``run_prompt`` and the durations of the timed steps (``model.complete`` in the prompt threads,
``local.start/execute/close``, the flow thread's ``ledger.record_row``, ``progress.record``,
``future.wait``). Prints, in ms, mean / median / p90 / max of each step, the prompt duration,
and the gap between a prompt's end and the start of the prompt that took its slot (the k-th end
against the (k + W)-th start, W prompts in flight).

Usage: ``python bench/timeline.py timeline.json --workers W [--call-ms 10000]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def summary(values: list[float]) -> dict[str, float]:
    """mean, median, p90 and max of ``values`` (seconds) in ms."""
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 1),
        "median_ms": round(ordered[len(ordered) // 2] * 1000, 1),
        "p90_ms": round(ordered[int(len(ordered) * 0.9)] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


def analyse(data: dict[str, Any], workers: int) -> dict[str, Any]:
    """The figures of one timeline: steps, prompt durations, slot gaps, the span of the prompt phase."""
    spans = sorted(data["spans"])
    starts = sorted(s for s, _ in spans)
    ends = sorted(e for _, e in spans)
    gaps = (
        [starts[k + workers] - ends[k] for k in range(len(ends) - workers)] if len(starts) > workers else []
    )
    out: dict[str, Any] = {name: summary(values) for name, values in sorted(data["steps"].items())}
    out["prompt"] = summary([e - s for s, e in spans])
    out["slot_gap"] = summary(gaps)
    if spans:
        out["first_start_to_last_end_s"] = round(ends[-1] - starts[0], 2)
        out["last_start_to_last_end_s"] = round(ends[-1] - starts[-1], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the summary of a timeline file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path")
    p.add_argument("--workers", type=int, required=True)
    args = p.parse_args(argv)
    figures = analyse(json.loads(Path(args.path).read_text()), args.workers)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
