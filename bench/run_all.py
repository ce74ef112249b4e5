"""Run every benchmark and write ``bench/results.md`` (figures, targets, machine, date, commit).

``python bench/run_all.py --quick`` fits in about ten minutes on a 2-core machine: N = 8 x W
prompts per W but at most 1,024 (so N = 4 x W at W = 256), the heavy-tailed mix of 128 prompts,
Prefect's floor at W = 64, flow memory at N = 1,000 and 2,000, resume of a 10,000-prompt run,
post-processing of 100,000 rows. Without ``--quick``: N = 8 x W everywhere, Prefect's floor at
W = 64 and 256, memory at N = 1,000 and 10,000, and the large parts: W = 1,024 at 10 s per call
(N = 4 x W; isolation auto and none), a 1,000,000-record dataset up to its first prompts
(bench/dataset_scale.py) and the resume of a finished 1,000,000-prompt run (bench/resume.py
--n 1000000, about 30 minutes to synthesise once, then cached; ~45 GB of disk). Generated data
(the synthesised runs, the 100,000 rows) is cached under ``$HERMES_BENCH_DIR``
(default /tmp/hermes-bench) and reused. Each benchmark also runs on its own; see its ``--help``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, WORK, git_commit, log, machine, now_utc  # noqa: E402

TARGETS = {
    "eff64": 0.90,
    "eff256": 0.75,
    "eff1024": 0.95,
    "heavy_ratio": 1.5,
    "orch_floor_ratio": 1.3,
    "setup_s": 60.0,
    "setup_rss_mb": 1024.0,
    "resume_big_s": 60.0,
    "resume_big_rss_mb": 1536.0,
    "resume_s": 15.0,
    "post_s": 60.0,
    "post_rss_mb": 1024.0,
}


PARTS = ("throughput", "resume", "postprocess")
BIG_PARTS = {
    "throughput_1024": [
        "--workers", "1024", "--latency-ms", "10000", "--per-worker", "4", "--parts", "none",
        "--experiments", "isolation-none=HERMES_LOCAL_ISOLATION=none",
    ],
    "floor_1024": [
        "--workers", "1024", "--latency-ms", "10000", "--per-worker", "4", "--parts", "floor",
    ],
    "throughput_dask": [
        "--workers", "256", "--max-n", "1024", "--parts", "none",
        "--experiments", "dask-2-workers=option.task_runner=dask+option.dask_workers=2",
    ],
    "dataset_scale": [],
    "resume_1m": ["--n", "1000000", "--first-prompt-only"],
}  # fmt: skip
"""The full run's large parts: name -> arguments (the script is :data:`SCRIPTS` or the name)."""
SCRIPTS = {
    "throughput_1024": "throughput",
    "floor_1024": "throughput",
    "throughput_dask": "throughput",
    "resume_1m": "resume",
}
"""Parts that run a benchmark script under another name (other arguments)."""


def run_bench(name: str, args: list[str], results: Path) -> tuple[dict[str, Any] | None, str]:
    """Run ``bench/<script>.py`` with ``--json``; returns its figures (None on failure) and its stdout."""
    out = results / f"{name}.json"
    out.unlink(missing_ok=True)
    script = SCRIPTS.get(name, name)
    log(f"running bench/{script}.py {' '.join(args)}")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / f"{script}.py"), *args, "--json", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=open(results / f"{name}.log", "w"),
        text=True,
    )
    log(f"bench/{script}.py finished in {time.monotonic() - t0:.0f} s (exit {proc.returncode})")
    print(proc.stdout, flush=True)
    if proc.returncode != 0 or not out.exists():
        return None, proc.stdout + f"\n(failed with exit {proc.returncode}; see {results / (name + '.log')})"
    data = json.loads(out.read_text())
    data["_wall_s"] = round(time.monotonic() - t0, 1)
    return data, proc.stdout


def _ok(met: bool | None) -> str:
    return "n/a" if met is None else ("**met**" if met else "**missed**")


def _shared_efficiency(shared: dict | None) -> str:
    """The efficiency of Prefect's floor sharing its process with the agent core (``""`` when not measured)."""
    if not shared:
        return ""
    return (
        f"; that floor with the agent core in its process (one GIL, no code of ours) {shared['efficiency']}"
    )


def targets_table(tp: dict | None, rs: dict | None, pp: dict | None, big: dict | None = None) -> list[str]:
    """Markdown rows: target, figure reached, verdict (``big``: the parts of the full run only)."""
    rows = ["| target | reached | |", "|---|---|---|"]
    big = big or {}

    def scaling_row(w: int) -> dict | None:
        for r in (tp or {}).get("scaling", []):
            if r["workers"] == w:
                return r
        return None

    floor_eff = {f["workers"]: f["efficiency"] for f in (tp or {}).get("prefect_floor", [])}
    shared = {f["workers"]: f for f in (tp or {}).get("prefect_floor_with_core", [])}
    for w, key in ((64, "eff64"), (256, "eff256")):
        r = scaling_row(w)
        eff = r["ours"]["efficiency"] if r else None
        context = f"; Prefect's floor (trivial tasks, same run) {floor_eff[w]}" if w in floor_eff else ""
        context += _shared_efficiency(shared.get(w))
        rows.append(
            f"| efficiency >= {TARGETS[key]} at W = {w} | {eff if eff is not None else '-'} "
            f"(N = {r['n'] if r else '-'}){context} | {_ok(None if eff is None else eff >= TARGETS[key])} |"
        )
    h = (tp or {}).get("heavy_tail")
    ratio = h.get("throughput_ratio_ours_over_baseline") if h else None
    rows.append(
        f"| heavy-tailed mix, W = 16: throughput >= {TARGETS['heavy_ratio']} x baseline | "
        f"{ratio if ratio is not None else '-'} x | {_ok(None if ratio is None else ratio >= TARGETS['heavy_ratio'])} |"
    )
    floors = {f["workers"]: f for f in (tp or {}).get("prefect_floor", [])}
    for r in (tp or {}).get("scaling", []):
        f = floors.get(r["workers"])
        if f is None:
            continue
        o, floor = r["ours"], f["orchestration_cpu_ms_per_prompt"]
        total, net = o["orchestration_cpu_ms_per_prompt"], o.get("orchestration_net_cpu_ms_per_prompt")
        net_text = (
            f"; net of the agent core alone ({o['agent_core_cpu_ms_per_prompt']} ms): {net} ms, {net / floor:.2f} x"
            if net is not None
            else ""
        )
        s = shared.get(r["workers"])
        shared_text = (
            f"; against that floor sharing its process with the agent core on the same prompts: "
            f"{s['orchestration_cpu_ms_per_prompt']} ms, {total / s['orchestration_cpu_ms_per_prompt']:.2f} x"
            if s
            else ""
        )
        rows.append(
            f"| orchestration CPU per prompt (flow + server) <= {TARGETS['orch_floor_ratio']} x Prefect's floor per "
            f"task, same run, W = {r['workers']} | {total} ms against a floor of {floor} ms: {total / floor:.2f} x"
            f"{net_text}{shared_text} | {_ok(total <= TARGETS['orch_floor_ratio'] * floor)} |"
        )
    w1024 = (big.get("throughput_1024") or {}).get("experiments", [])
    floor1024 = [f["efficiency"] for f in (big.get("floor_1024") or {}).get("prefect_floor", [])]
    shared1024 = (big.get("floor_1024") or {}).get("prefect_floor_with_core", [])
    for e in w1024:
        ideal = 3 * 10.0 * e["n"] / e["workers"]
        eff = round(ideal / e["wall_s"], 3)
        context = f"; Prefect's floor (trivial tasks, W = 1,024) {floor1024[0]}" if floor1024 else ""
        context += _shared_efficiency(shared1024[0] if shared1024 else None)
        rows.append(
            f"| efficiency >= {TARGETS['eff1024']} at W = 1,024, 10 s per call (variant `{e['variant']}`) | {eff} "
            f"(N = {e['n']}){context} | {_ok(eff >= TARGETS['eff1024'])} |"
        )
    ds = big.get("dataset_scale")
    if ds:
        f = ds["flow"]
        first, rss = f.get("first_prompt_s"), f.get("peak_rss_first_prompt_mb")
        met = first is not None and first <= TARGETS["setup_s"] and rss <= TARGETS["setup_rss_mb"]
        rows.append(
            f"| {ds['n']:,}-record dataset: read, validated, identities, planned <= {TARGETS['setup_s']:g} s, flow peak RSS "
            f"before the first prompt <= 1 GB | first prompt at {first} s, {rss} MB | {_ok(met)} |"
        )
        by_done = f.get("rss_by_done_mb") or {}
        if len(by_done) >= 2:
            values = list(by_done.values())
            rows.append(
                f"| ... and flat memory while prompts run (W = {ds['workers']}) | RSS {values[0]} -> {values[-1]} MB "
                f"over {list(by_done)[0]} -> {list(by_done)[-1]} prompts | {_ok(values[-1] - values[0] <= 50)} |"
            )
    rb = big.get("resume_1m")
    if rb:
        a, b = rb["resume_nothing"], rb["resume_one_percent"]
        met = (
            a["cli_wall_s"] <= TARGETS["resume_big_s"]
            and a["cli_peak_rss_mb"] <= TARGETS["resume_big_rss_mb"]
            and a["model_requests"] == 0
        )
        rows.append(
            f"| `--resume` of a finished {rb['n']:,}-prompt run <= {TARGETS['resume_big_s']:g} s, <= 1.5 GB, no model "
            f"request | {a['cli_wall_s']} s, {a['cli_peak_rss_mb']} MB, {a['model_requests']} requests | {_ok(met)} |"
        )
        first = b.get("first_model_request_s")
        rows.append(
            f"| ... with 1% to re-run: first prompt within {TARGETS['resume_big_s']:g} s | first model request at "
            f"{first} s, peak RSS {b['cli_peak_rss_mb']} MB | {_ok(first is not None and first <= TARGETS['resume_big_s'])} |"
        )
    dask = (big.get("throughput_dask") or {}).get("experiments", [])
    if len(dask) >= 2:
        threads, other = dask[0], dask[1]
        rows.append(
            f"| W = {threads['workers']}: `--task_runner=dask --dask_workers=2` against threads | threads "
            f"{threads['wall_s']} s, Dask {other['wall_s']} s | {_ok(other['wall_s'] < threads['wall_s'])} |"
        )
    if big:
        labels = {
            "throughput_1024": "W = 1,024 at 10 s per call",
            "throughput_dask": "W = 256, threads against Dask",
            "dataset_scale": "1,000,000-record dataset",
            "resume_1m": "`--resume` of a finished 1,000,000-prompt run",
        }
        for name, label in labels.items():
            if not big.get(name):
                rows.append(
                    f"| {label} | not measured in this run (skipped, or it failed): see the analysis | n/a |"
                )
    rn = (rs or {}).get("resume_nothing")
    if rn:
        met = rn["cli_wall_s"] <= TARGETS["resume_s"] and rn["model_requests"] == 0
        rows.append(
            f"| `--resume` of a finished {rs['n']:,}-prompt run <= {TARGETS['resume_s']:g} s, no model request | "
            f"{rn['cli_wall_s']} s, {rn['model_requests']} requests | {_ok(met)} |"
        )
    else:
        rows.append("| `--resume` of a finished 10,000-prompt run | - | n/a |")
    pr = (pp or {}).get("result")
    if pr:
        met = pr["total_s"] <= TARGETS["post_s"] and pr["peak_rss_mb"] <= TARGETS["post_rss_mb"]
        rows.append(
            f"| post-processing of {pp['data']['rows']:,} rows <= {TARGETS['post_s']:g} s, peak RSS <= 1 GB | "
            f"{pr['total_s']} s, {pr['peak_rss_mb']} MB | {_ok(met)} |"
        )
    else:
        rows.append("| post-processing of 100,000 rows | - | n/a |")
    mem = (tp or {}).get("memory", [])
    if len(mem) >= 2:
        a, b = mem[0], mem[-1]
        growth = b["peak_rss_mb"] - a["peak_rss_mb"]
        per_k = growth / max(1, (b["n"] - a["n"]) / 1000)
        flat = per_k <= 10  # MB per 1,000 prompts: flat within noise
        rows.append(
            f"| flow peak RSS flat in N (W = 256) | N = {a['n']:,}: {a['peak_rss_mb']:.0f} MB, N = {b['n']:,}: "
            f"{b['peak_rss_mb']:.0f} MB ({per_k:+.1f} MB per 1,000 prompts) | {_ok(flat)} |"
        )
    return rows


def floor_under_load(tp: dict) -> list[str]:
    """Prefect's floor with the prompt task's options, alone and sharing its process with the agent core."""
    lines = []
    cores = {r["workers"]: r for r in tp.get("scaling", []) if r.get("core")}
    shared = {f["workers"]: f for f in tp.get("prefect_floor_with_core", [])}
    for like in tp.get("prefect_floor_like_prompt", []):
        w = like["workers"]
        text = (
            f"The same floor with the prompt task's Prefect options and an ~11 KB result (`like_prompt`), W = {w}: "
            f"{like['orchestration_cpu_ms_per_prompt']} ms per task ({like['flow_cpu_ms_per_prompt']} + "
            f"{like['server_cpu_ms_per_prompt']}); flow process garbage collection {like.get('flow_gc_ms_per_prompt', '-')} ms."
        )
        s, row = shared.get(w), cores.get(w)
        if s and row:
            core = row["core"]["cpu_ms_per_prompt"]
            ours = row["ours"]
            alone = like["flow_cpu_ms_per_prompt"] + core
            text += (
                f" Sharing its process with the agent core on the same prompts (W more threads, one GIL): flow "
                f"{s['flow_cpu_ms_per_prompt']} ms per task against {alone:.2f} for the two apart (floor "
                f"{like['flow_cpu_ms_per_prompt']} + agent core {core}): **{s['flow_cpu_ms_per_prompt'] - alone:+.2f} ms of "
                f"contention**. Our flow process: {ours['flow_cpu_ms_per_prompt']} ms per prompt, "
                f"{ours['flow_cpu_ms_per_prompt'] - s['flow_cpu_ms_per_prompt']:+.2f} ms against that shared floor; "
                f"server {ours['server_cpu_ms_per_prompt']} against {s['server_cpu_ms_per_prompt']}; garbage collection "
                f"{ours.get('flow_gc_ms_per_prompt', '-')} ms against {s.get('flow_gc_ms_per_prompt', '-')}."
            )
        lines += [text, ""]
    return lines


def _load_note(start: list[float]) -> list[str]:
    """A warning when the machine was busy before the benchmarks started (1-minute load average above 1;
    at the end the load is the benchmarks' own)."""
    if start[0] <= 1.0:
        return []
    return [
        "> The machine had other work when the benchmarks started (load average above 1), so wall-clock figures",
        "> (efficiency, ratios) are noisy; CPU-time figures much less so.",
        "",
    ]


def render(
    mode: str,
    info: dict[str, Any],
    tp: dict | None,
    rs: dict | None,
    pp: dict | None,
    raw: dict,
    big: dict | None = None,
) -> str:
    """The whole results.md (``big``: figures of the full run's large parts, by part name)."""
    big = big or {}
    m = info["machine"]
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `python bench/run_all.py{' --quick' if mode == 'quick' else ''}` on {info['date']} "
        f"(commit `{info['commit']}`), {info['wall_s']:.0f} s in all.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB RAM; {m['os']}; Python {m['python']}; "
        f"Prefect {m['prefect']}. Load average at start {m['load_average']}, at end {info['load_end']}.",
        "",
        *_load_note(m["load_average"]),
        "## Targets",
        "",
        *targets_table(tp, rs, pp, big),
        "",
        "How each figure is measured: see the docstrings of `bench/throughput.py`, `bench/resume.py`,",
        "`bench/postprocess.py`. The causes of the misses, found by profiling, are in",
        "[Analysis](#analysis-of-the-misses) below.",
        "",
    ]
    if tp:
        lines += [
            "## Throughput and scaling (`bench/throughput.py`)",
            "",
            f"Mock model in its own process, {tp['latency_ms']} ms per call, 3 calls per prompt (two tool turns: "
            f"a terminal command, then a file write, in the prompt's sandbox; then the answer), distribution "
            f"`{tp['distribution']}`, N = {tp['per_worker']} x W"
            + (f" but at most {tp['max_n']}" if tp.get("max_n") else "")
            + ", batch_size = N / W (one batch per baseline worker: its best case with a fixed latency). "
            f"Prefect server: `prefect server start`, {tp['database']}, settings {tp.get('server_env') or 'Prefect defaults'}. "
            "Baseline: `bench/baseline_reference.py` (the reference's `multiprocessing.Pool(W).map` over fixed "
            "batches, prompts sequential in a batch, same agent core and mock).",
            "",
            "| W | N | ideal s | ours s | prompts/s | efficiency | orchestration CPU ms/prompt (flow + server) "
            "| agent core alone: CPU ms/prompt, efficiency | net orchestration CPU ms/prompt "
            "| baseline s | baseline efficiency | ours / baseline | flow peak RSS MB | machine CPU busy |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in tp.get("scaling", []):
            o, b, c = r["ours"], r.get("baseline", {}), r.get("core")
            core = "-"
            if c:
                core_ideal = c["prompts"] * 3 * tp["latency_ms"] / 1000 / r["workers"]
                core = f"{c['cpu_ms_per_prompt']}, {core_ideal / c['wall_s']:.3f}"
            lines.append(
                f"| {r['workers']} | {r['n']} | {o['ideal_s']} | {o['wall_s']} | {o['prompts_per_s']} | "
                f"{o['efficiency']} | {o['orchestration_cpu_ms_per_prompt']} ({o['flow_cpu_ms_per_prompt']} + "
                f"{o['server_cpu_ms_per_prompt']}) | {core} | {o.get('orchestration_net_cpu_ms_per_prompt', '-')} | "
                f"{b.get('wall_s', '-')} | {b.get('efficiency', '-')} | "
                f"{r.get('ratio_ours_over_baseline', '-')} | {o['peak_rss_mb']:.0f} | "
                f"{o['machine_cpu_utilisation']:.0%} |"
            )
        lines += [
            "",
            "Other CPU per prompt, not counted as orchestration (same runs): mock server "
            + ", ".join(f"{r['ours']['mock_cpu_ms_per_prompt']}" for r in tp.get("scaling", []))
            + " ms; tool subprocesses "
            + ", ".join(f"{r['ours']['tool_subprocess_cpu_ms_per_prompt']}" for r in tp.get("scaling", []))
            + " ms; the baseline's agent core (its workers' own CPU) "
            + ", ".join(
                f"{r.get('baseline', {}).get('agent_core_cpu_ms_per_prompt', '-')}"
                for r in tp.get("scaling", [])
            )
            + " ms (W in the order above).",
            "",
        ]
        h = tp.get("heavy_tail")
        if h:
            b = h.get("baseline", {})
            lines += [
                f"Heavy-tailed mix: N = {h['n']}, {h['slow_prompts']} prompts (10%) at {h['slow_ms']} ms per call, the "
                f"others at {h['fast_ms']} ms, W = {h['workers']}, batch_size = {h['batch_size']}; ideal "
                f"{h['ideal_s']} s. Ours {h['ours']['wall_s']} s ({h['ours']['prompts_per_s']} prompts/s, efficiency "
                f"{h['ours']['efficiency']}); baseline {b.get('wall_s', '-')} s ({b.get('prompts_per_s', '-')} prompts/s). "
                f"**Throughput ours / baseline: {h.get('throughput_ratio_ours_over_baseline', '-')} x.**",
                "",
            ]
        for f in tp.get("prefect_floor", []):
            lines += [
                f"Prefect's own floor (same server): a flow of {f['n']} trivial tasks that sleep {f['sleep_s']} s, "
                f"W = {f['workers']}, persisted results: efficiency {f['efficiency']}, {f['orchestration_cpu_ms_per_prompt']} "
                f"ms CPU per task ({f['flow_cpu_ms_per_prompt']} client + {f['server_cpu_ms_per_prompt']} server).",
                "",
            ]
        lines += floor_under_load(tp)
        if tp.get("memory"):
            lines += [
                "Flow process memory, W = 256 (`ru_maxrss`; prompt phase = the peak when the merge starts; "
                "malloc arenas capped at 4 by the flow, `flows/tuning.py`):",
                "",
                "| N | peak RSS MB | prompt phase MB | wall s |",
                "|---|---|---|---|",
            ]
            lines += [
                f"| {m_['n']:,} | {m_['peak_rss_mb']:.0f} | {m_.get('peak_rss_prompt_phase_mb') or 0:.0f} | {m_['wall_s']} |"
                for m_ in tp["memory"]
            ]
            lines.append("")
        for e in tp.get("experiments", []):
            lines.append(
                f"- experiment `{e['variant']}`: {e['orchestration_cpu_ms_per_prompt']} ms/prompt "
                f"(flow {e['flow_cpu_ms_per_prompt']}, server {e['server_cpu_ms_per_prompt']}), wall {e['wall_s']} s, "
                f"peak RSS {e['peak_rss_mb']:.0f} MB"
            )
        if tp.get("experiments"):
            lines.append("")
    else:
        lines += ["## Throughput", "", "```", raw.get("throughput", "not run"), "```", ""]
    if rs:
        a, b = rs["resume_nothing"], rs["resume_one_percent"]
        lines += [
            "## Resume (`bench/resume.py`)",
            "",
            f"A finished run of {rs['n']:,} prompts ({rs['run_size_mb']} MB of batch files, batch_size "
            f"{rs['batch_size']}, synthesised through the ledger's own code path from real rows), resumed with the "
            "real command line as a subprocess against the Prefect server (start to exit, Python start-up included):",
            "",
            "| case | command line s | flow s | prompts run | model requests | exit |",
            "|---|---|---|---|---|---|",
            f"| `--resume`, nothing to do | {a['cli_wall_s']} | {a['flow_duration_s']} | {a['ran']} | "
            f"{a['model_requests']} | {a['exit_code']} |",
            f"| `--resume`, {rs['rerun']} failed prompts (1%) to re-run, 3 x 1 s calls each | {b['cli_wall_s']} | "
            f"{b['flow_duration_s']} | {b['ran']} | {b['model_requests']} | {b['exit_code']} |",
            "",
        ]
    lines += big_sections(big)
    if pp:
        d, r = pp["data"], pp["result"]
        kb = d["row_kb"]
        lines += [
            "## Post-processing (`bench/postprocess.py`)",
            "",
            f"{d['rows']:,} rows in {d['batch_files']} batch files, {d['bytes'] / 2**30:.2f} GB; row size KB: min "
            f"{kb['min']}, median {kb['median']}, mean {kb['mean']}, p99 {kb['p99']}, max {kb['max']}; tools "
            f"{', '.join(d['tools'])}; {d['hallucinated']} rows with a hallucinated tool, {d['duplicates']} "
            f"duplicates, {d['tombstones']} tombstones. In a fresh process:",
            "",
            "| merge (order, dedupe, filter) s | statistics s | total s | peak RSS MB | RSS after imports MB | rows written |",
            "|---|---|---|---|---|---|",
            f"| {r['merge_s']} | {r['statistics_s']} | {r['total_s']} | {r['peak_rss_mb']} | {r['rss_before_mb']} | "
            f"{r['rows_written']:,} |",
            "",
        ]
    analysis = (Path(__file__).resolve().parent / "ANALYSIS.md").read_text(encoding="utf-8")
    lines += [analysis.rstrip(), ""]
    return "\n".join(lines)


def big_sections(big: dict[str, Any]) -> list[str]:
    """Sections of the full run's large parts (W = 1,024; 10^6 records; resume of 10^6 prompts)."""
    lines: list[str] = []
    w1024 = (big.get("throughput_1024") or {}).get("experiments", [])
    if w1024:
        lines += [
            "## W = 1,024 (`bench/throughput.py --workers 1024 --latency-ms 10000 --per-worker 4`)",
            "",
            "| variant | N | ideal s | ours s | efficiency | orchestration CPU ms/prompt (flow + server) | flow peak RSS MB |",
            "|---|---|---|---|---|---|---|",
        ]
        for e in w1024:
            ideal = 3 * 10.0 * e["n"] / e["workers"]
            lines.append(
                f"| `{e['variant']}` | {e['n']} | {ideal:g} | {e['wall_s']} | {ideal / e['wall_s']:.3f} | "
                f"{e['orchestration_cpu_ms_per_prompt']} ({e['flow_cpu_ms_per_prompt']} + {e['server_cpu_ms_per_prompt']}) | "
                f"{e['peak_rss_mb']:.0f} |"
            )
        floors = big.get("floor_1024") or {}
        labels = {
            "prefect_floor": "Prefect's floor: {n} trivial tasks sleeping {s:g} s",
            "prefect_floor_like_prompt": "the same with the prompt task's options (`like_prompt`)",
            "prefect_floor_with_core": "`like_prompt` sharing its process with the agent core (2 x 1,024 threads)",
        }
        for key, label in labels.items():
            for f in floors.get(key, []):
                lines.append(
                    f"| {label.format(n=f['n'], s=f['sleep_s'])} | {f['n']} | {f['ideal_s']:g} | "
                    f"{f['wall_s']} | {f['efficiency']} | {f['orchestration_cpu_ms_per_prompt']} "
                    f"({f['flow_cpu_ms_per_prompt']} + {f['server_cpu_ms_per_prompt']}) | {f['peak_rss_mb']:.0f} |"
                )
        lines.append("")
    dask = (big.get("throughput_dask") or {}).get("experiments", [])
    if dask:
        lines += [
            f"## Scale-out on one machine: threads against `--task_runner=dask --dask_workers=2` (W = {dask[0]['workers']}, "
            "1 s per call)",
            "",
            "| variant | N | ideal s | ours s | efficiency | flow process CPU ms/prompt | server CPU ms/prompt |",
            "|---|---|---|---|---|---|---|",
        ]
        for e in dask:
            ideal = 3 * 1.0 * e["n"] / e["workers"]
            lines.append(
                f"| `{e['variant']}` | {e['n']} | {ideal:g} | {e['wall_s']} | {ideal / e['wall_s']:.3f} | "
                f"{e['flow_cpu_ms_per_prompt']} | {e['server_cpu_ms_per_prompt']} |"
            )
        lines += [
            "",
            "(With Dask the prompts run in the Dask worker processes: the flow process's CPU then excludes them.)",
            "",
        ]
    ds = big.get("dataset_scale")
    if ds:
        f, r = ds["flow"], ds["read"]
        lines += [
            "## A 1,000,000-record dataset (`bench/dataset_scale.py`)",
            "",
            f"{ds['n']:,} records, {ds['dataset_mb']} MB (prompts of 200-2,000 characters, 3% duplicates). Reading, "
            f"validation and identities alone: {r['read_and_identity_s']} s, peak RSS {r['peak_rss_mb']} MB. The real "
            f"flow at W = {ds['workers']}: first prompt {f.get('first_prompt_s')} s after the flow call, peak RSS "
            f"{f.get('peak_rss_first_prompt_mb')} MB then; RSS (MB) by prompts finished {f.get('rss_by_done_mb')}; "
            f"stopped by SIGTERM: {f['state']}. Load average at the end {ds.get('load_average')}.",
            "",
        ]
    rb = big.get("resume_1m")
    if rb:
        a, b = rb["resume_nothing"], rb["resume_one_percent"]
        lines += [
            "## Resume of a 1,000,000-prompt run (`bench/resume.py --n 1000000 --first-prompt-only`)",
            "",
            f"{rb['n']:,} prompts, {rb['run_size_mb']} MB of batch files. Nothing to do: {a['cli_wall_s']} s command line "
            f"(flow {a['flow_duration_s']} s), peak RSS {a['cli_peak_rss_mb']} MB, {a['model_requests']} model requests, "
            f"exit {a['exit_code']}. 1% ({rb['rerun']:,}) to re-run: first model request at {b['first_model_request_s']} s, "
            f"then stopped; peak RSS {b['cli_peak_rss_mb']} MB.",
            "",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and write the results file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="sizes that fit in about ten minutes on 2 cores")
    p.add_argument(
        "--skip",
        default="",
        help="comma list of parts to skip: throughput,resume,postprocess,throughput_1024,throughput_dask,"
        "dataset_scale,resume_1m",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results.md"))
    p.add_argument(
        "--render-only", action="store_true", help="rewrite the results file from the last run's figures"
    )
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    results = WORK / "results"
    results.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        info = json.loads((results / "info.json").read_text())
        figures = {n: json.loads((results / f"{n}.json").read_text()) for n in (*PARTS, *BIG_PARTS)
                   if (results / f"{n}.json").exists()}  # fmt: skip
        text = render(
            info["mode"],
            info,
            figures.get("throughput"),
            figures.get("resume"),
            figures.get("postprocess"),
            {},
            {n: figures.get(n) for n in BIG_PARTS} if info["mode"] == "full" else None,
        )
        Path(args.out).write_text(text, encoding="utf-8")
        log(f"wrote {args.out}")
        return 0
    info: dict[str, Any] = {"date": now_utc(), "commit": git_commit(), "machine": machine()}
    t0 = time.monotonic()
    raw: dict[str, str] = {}
    quick = ["--quick"] if args.quick else []
    figures: dict[str, Any] = {}
    plan = {"throughput": quick, "resume": [], "postprocess": []}
    if not args.quick:
        plan.update(BIG_PARTS)
    for name, bench_args in plan.items():
        if name in skip:
            continue
        figures[name], raw[name] = run_bench(name, bench_args, results)
    info["wall_s"] = time.monotonic() - t0
    info["load_end"] = [round(x, 2) for x in __import__("os").getloadavg()]
    info["mode"] = "quick" if args.quick else "full"
    (results / "info.json").write_text(json.dumps(info, indent=2))
    text = render(
        "quick" if args.quick else "full",
        info,
        figures.get("throughput"),
        figures.get("resume"),
        figures.get("postprocess"),
        raw,
        {n: figures.get(n) for n in BIG_PARTS},
    )
    Path(args.out).write_text(text, encoding="utf-8")
    log(f"wrote {args.out}")
    return 0 if all(figures.get(n) is not None for n in plan if n not in skip) else 1


if __name__ == "__main__":
    raise SystemExit(main())
