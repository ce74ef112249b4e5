"""Post-processing at dataset scale: filters + merge + statistics of 100,000 realistic rows.

Rows are made from real trajectories: ``hermes_core.run_prompt`` against the mock model with
several tool mixes (terminal only; terminal + file tools over 1-6 tool turns, so terminal,
write_file, read_file, search_files and patch appear) gives template rows; each of the N rows
copies a template with its own identity and a tool output padded to a size drawn from a
log-normal distribution (median ``--median-kb``, clipped to 2-100 KB). The run folder has
``batch_<n>.jsonl`` files of ``--batch-size`` rows, rows inside a batch in completion order,
plus what the filters must handle: 0.5% rows naming a hallucinated tool, 0.5% duplicates
re-written by a later invocation, and tombstones of 2% more prompts in ``discarded.jsonl``.
The folder is generated once into ``$HERMES_BENCH_DIR/postprocess-cache`` (not committed).

Timed, in a fresh child process: ``hermes_core.runfolder.postprocess.merge_trajectories`` (ordering,
deduplication, hallucinated-tool filter) then ``compute_statistics``; peak RSS of that process
(``ru_maxrss``; its RSS after imports and building ``index_of`` is given too).

Usage: ``python bench/postprocess.py [--rows 100000] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import WORK, emit, log, peak_rss_mb, run_child, save_json  # noqa: E402

from hermes_core.runfolder.folder import MERGE_STATE_PREFIX, RunFolder  # noqa: E402

GENERATOR_VERSION = 1
_LS_LINE = "-rw-r--r-- 1 root root {size:>6} Nov 29 12:{m:02d} {name}\n"


def template_rows() -> list[dict[str, Any]]:
    """Real trajectory rows from the agent core against the in-process mock model (several tool mixes)."""
    from hermes_core import ModelOptions, PromptJob, RunSpec, run_prompt
    from hermes_core.mockllm import MockServer

    mixes = [(["terminal"], t) for t in (1, 2, 3)] + [(["terminal", "file"], t) for t in (1, 2, 3, 4, 6)]
    rows = []
    with MockServer() as server:
        for n, (toolsets, turns) in enumerate(mixes):
            spec = RunSpec(
                run_name="postprocess-bench",
                model=ModelOptions(model=f"mock/scripted?turns={turns}&parallel={1 + n % 2}"),
                base_url=server.base_url,
                toolsets=toolsets,
            )
            prompt = f"Template {n}: inspect the project, write a helper and check it"
            job = PromptJob(
                prompt_index=n, prompt_id=f"template-{n}", record_key=f"template-{n}", prompt=prompt
            )
            rows.append(run_prompt(job, spec).row)
    return rows


def _filler(rng: random.Random, size: int) -> str:
    """About ``size`` characters of directory-listing-like tool output."""
    out, total = [], 0
    while total < size:
        line = _LS_LINE.format(
            size=rng.randrange(100, 99999), m=rng.randrange(60), name=f"file_{rng.randrange(10**6)}.py"
        )
        out.append(line)
        total += len(line)
    return "".join(out)


def generate(folder: Path, rows: int, batch_size: int, median_kb: float, seed: int = 5) -> dict[str, Any]:
    """Write the run folder (batch files, discarded.jsonl) and ``index_of.json``; returns its description."""
    rng = random.Random(seed)
    templates = template_rows()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    ids = [hashlib.sha256(f"bench-{i}".encode()).hexdigest()[:32] for i in range(rows)]
    hallucinated = set(rng.sample(range(rows), rows // 200))
    duplicated = sorted(rng.sample(range(rows), rows // 200))
    mu = math.log(median_kb * 1024)
    sizes = []
    nbatch = 0
    order = list(range(rows))
    t0 = time.monotonic()

    def make_row(i: int, batch: int) -> bytes:
        template = templates[i % len(templates)]
        row = copy.deepcopy(template)
        row["prompt_index"] = i
        row["metadata"]["prompt_id"] = ids[i]
        row["metadata"]["batch_num"] = batch
        row["metadata"]["source"] = {"task_id": i}
        row["conversations"][1]["value"] = f"Task {i}: inspect the project, write a helper and check it"
        if i in hallucinated:
            row["tool_stats"] = {
                **row["tool_stats"],
                "hallucinated_tool": {"count": 1, "success": 0, "failure": 1},
            }
        base = len(json.dumps(row, ensure_ascii=False))
        target = int(min(100 * 1024, max(2 * 1024, rng.lognormvariate(mu, 0.8))))
        tool_turns = [t for t in row["conversations"] if t["from"] == "tool"]
        if target > base and tool_turns:
            turn = tool_turns[rng.randrange(len(tool_turns))]
            turn["value"] = turn["value"].replace(
                "</tool_response>", _filler(rng, target - base) + "</tool_response>", 1
            )
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        sizes.append(len(data))
        return data

    for start in range(0, rows, batch_size):
        members = order[start : start + batch_size]
        rng.shuffle(members)  # rows land in completion order
        with open(RunFolder(folder).batch(nbatch), "wb") as fh:
            for i in members:
                fh.write(make_row(i, nbatch))
        nbatch += 1
    with open(RunFolder(folder).batch(nbatch), "wb") as fh:  # a later invocation re-wrote some rows
        for i in duplicated:
            fh.write(make_row(i, nbatch))
    nbatch += 1
    discarded = rows // 50
    with open(RunFolder(folder).discarded, "wb") as fh:
        for k in range(discarded):
            tomb = {
                "prompt_id": hashlib.sha256(f"discarded-{k}".encode()).hexdigest()[:32],
                "prompt_index": rows + k,
                "assistant_turns": 3,
                "usage": {
                    "prompt_tokens": 2400,
                    "completion_tokens": 300,
                    "reasoning_tokens": 0,
                    "cost": None,
                },
                "time": "2026-11-30T00:00:00",
            }
            fh.write((json.dumps(tomb) + "\n").encode())
    (folder.parent / f"{folder.name}.index_of.json").write_text(
        json.dumps({pid: i for i, pid in enumerate(ids)})
    )
    sizes.sort()
    return {
        "rows": rows,
        "batch_files": nbatch,
        "hallucinated": len(hallucinated),
        "duplicates": len(duplicated),
        "tombstones": discarded,
        "bytes": sum(sizes),
        "row_kb": {
            "min": round(sizes[0] / 1024, 1),
            "median": round(sizes[len(sizes) // 2] / 1024, 1),
            "mean": round(sum(sizes) / len(sizes) / 1024, 1),
            "p99": round(sizes[int(len(sizes) * 0.99)] / 1024, 1),
            "max": round(sizes[-1] / 1024, 1),
        },
        "templates": len(templates),
        "tools": sorted({t for r in templates for t, s in r["tool_stats"].items() if s["count"]}),
        "generate_s": round(time.monotonic() - t0, 1),
    }


def child(folder: Path) -> None:
    """Child-process body: time merge + statistics on ``folder``; print the result line."""
    from hermes_core.runfolder.postprocess import compute_statistics, merge_trajectories
    from hermes_core.tools import ALL_POSSIBLE_TOOLS

    index_of = json.loads((folder.parent / f"{folder.name}.index_of.json").read_text())
    for state in folder.glob(f"{MERGE_STATE_PREFIX}*"):  # a cached folder: time the whole merge, not its skip
        state.unlink()
    rss_before = peak_rss_mb()
    t0 = time.perf_counter()
    merge = merge_trajectories(folder, index_of=index_of, valid_tools=ALL_POSSIBLE_TOOLS)
    t1 = time.perf_counter()
    stats = compute_statistics(
        folder,
        merge=merge,
        run_name="bench",
        distribution="default",
        model="mock/scripted",
        batch_size=100,
        index_of=index_of,
        duration_seconds=0,
        failed_prompt_ids=[],
        valid_tools=ALL_POSSIBLE_TOOLS,
    )
    t2 = time.perf_counter()
    emit(
        {
            "merge_s": round(t1 - t0, 2),
            "statistics_s": round(t2 - t1, 2),
            "total_s": round(t2 - t0, 2),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "rss_before_mb": round(rss_before, 1),
            "rows_written": merge.rows_written,
            "duplicates_dropped": merge.duplicates_dropped,
            "filtered_hallucinated": merge.filtered_hallucinated,
            "completed": stats["completed"],
            "discarded_no_reasoning": stats["discarded_no_reasoning"],
            "tool_calls": {t: s["count"] for t, s in stats["tool_statistics"].items() if s["count"]},
        }
    )


def main(argv: list[str] | None = None) -> int:
    """Generate (or reuse) the run folder, time merge + statistics in a child, print and save the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--median-kb", type=float, default=8.0)
    p.add_argument("--rebuild", action="store_true", help="generate the rows again")
    p.add_argument("--json", default=None, help="write the figures to this file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(Path(args.child))
        return 0
    cache = WORK / "postprocess-cache"
    folder = cache / f"v{GENERATOR_VERSION}-n{args.rows}-b{args.batch_size}-m{args.median_kb:g}"
    info_path = folder.parent / f"{folder.name}.json"
    if args.rebuild or not info_path.exists():
        log(f"generating {args.rows} rows into {folder} (once)")
        info_path.unlink(missing_ok=True)
        save_json(info_path, generate(folder, args.rows, args.batch_size, args.median_kb))
    info = json.loads(info_path.read_text())
    merged = RunFolder(folder).trajectories
    merged.unlink(missing_ok=True)
    log("merge + statistics in a child process")
    result = run_child(["bench/postprocess.py", "--child", str(folder)], {}, WORK / "postprocess.log")
    r = result.result
    out_mb = merged.stat().st_size / 2**20
    figures = {"data": info, "result": r, "merged_mb": round(out_mb, 1)}
    merged.unlink(missing_ok=True)
    kb = info["row_kb"]
    print(
        f"{info['rows']} rows in {info['batch_files']} batch files, {info['bytes'] / 2**30:.2f} GB "
        f"(row KB min {kb['min']} median {kb['median']} mean {kb['mean']} p99 {kb['p99']} max {kb['max']}; "
        f"tools {', '.join(info['tools'])})"
    )
    print(
        f"merge {r['merge_s']} s + statistics {r['statistics_s']} s = {r['total_s']} s; peak RSS {r['peak_rss_mb']} MB "
        f"(after imports and index_of: {r['rss_before_mb']} MB); written {r['rows_written']}, "
        f"duplicates {r['duplicates_dropped']}, hallucinated {r['filtered_hallucinated']}, "
        f"tombstones {r['discarded_no_reasoning']}"
    )
    if args.json:
        save_json(Path(args.json), figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
