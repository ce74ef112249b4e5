"""Throughput, scaling efficiency, orchestration CPU and flow memory, against the reference's model.

For each ``num_workers`` W, N = ``per_worker`` x W distinct prompts go through the real flow
(``flows.generate.generate_trajectories`` in a child process, against a real ``prefect server``
and the mock model in its own process) with a fixed latency per model call; each prompt makes
3 model calls (``turns=2``: two tool-calling turns, each followed by its tool run in the
prompt's sandbox: a real ``ls -la && echo ...`` terminal command, then a file write, then the
final answer). Then the same prompts go through the reference's execution model
(bench/baseline_reference.py: ``multiprocessing.Pool(W).map`` over fixed batches, prompts
sequential inside a batch, same agent core and mock).

Figures per W: wall seconds, prompts/s, efficiency = ideal / wall with ideal = N x (3 x latency)
/ W, orchestration CPU per prompt = (flow process CPU + Prefect server CPU) / N. The flow process
CPU is its own (all threads; not the tool subprocesses, not the mock server), from just before
the flow call to process exit (Prefect's exit flush included); the server's is its process tree's
CPU from the flow's start until it has ingested the run's events, minus its idle rate. The
baseline's "agent core CPU" (its workers' own CPU / N) is the same work without Prefect. The
agent core alone (bench/_core_child.py: the same prompts through ``run_prompt`` on W plain
threads in one process, no Prefect, no ledger) gives the work a prompt costs without
orchestration; net orchestration CPU = flow + server - agent core, the figure to set against
Prefect's floor per task. The floor part measures, per W, Prefect's floor (trivial tasks), the
same with the prompt task's options (``like_prompt``) and that floor sharing its process with
the agent core on the same prompts (``prefect_floor_with_core``): what one GIL costs Prefect's
engine, and an estimate (with 2 x W threads) of what a flow run could reach with no code of ours.
Every flow process also reports its garbage collections (``flow_gc_ms_per_prompt``).

Heavy-tailed mix: 90% of prompts at ``heavy_fast_ms`` per call, 10% (a seeded choice) at
``heavy_slow_ms``, W = 16, batch_size = 10; ours vs the baseline.

Memory: peak RSS of the flow process at W = 256 for each N of ``--memory-n``.

Usage: ``python bench/throughput.py [--quick] [--json out.json]`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from _common import WORK, MockModel, PrefectServer, PrivatePostgres, log, run_child, save_json, write_prompts  # noqa: E402

from flows.tuning import PREFECT_SERVER_SETTINGS  # noqa: E402

DIST = "terminal_only"
CALLS_PER_PROMPT = 3
SHARED_LIMIT_SLOTS = 4096
"""Slots of the benchmark's --concurrency_limit (more than any W: the cost of the mechanism, no throttling)."""
TUNED_SERVER = PREFECT_SERVER_SETTINGS
"""The server settings the product uses for its local API and recommends (flows/tuning.py)."""


class Bench:
    """The services of one throughput session and the runs made against them."""

    def __init__(
        self, mock: MockModel, server: PrefectServer, root: Path, child_env: dict[str, str] | None = None
    ):
        self.mock = mock
        self.server = server
        self.root = root
        self.child_env = dict(child_env or {})

    def ours(
        self,
        name: str,
        prompts: Path,
        n: int,
        *,
        workers: int,
        batch_size: int,
        model: str,
        profile: str | None = None,
        pyspy: Path | None = None,
        patches: list[str] | None = None,
        child_env: dict[str, str] | None = None,
        tracemalloc: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One run of the real flow (bench/_flow_child.py); returns its figures.

        With ``pyspy`` (a folder), the flow process and the server are sampled by py-spy
        (raw collapsed stacks ``flow.txt`` and ``server.txt``); CPU figures are then not valid.
        """
        run_dir = self.root / "runs" / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        config = self.config(
            name, prompts, workers=workers, batch_size=batch_size, model=model, options=options
        )
        child_spec = {
            "config": config,
            "profile": profile,
            "patches": patches or [],
            "tracemalloc": tracemalloc,
            "census": str(self.root / f"{name}.census.json")
            if os.environ.get("HERMES_BENCH_CENSUS")
            else None,
        }
        return self.measure(
            name, n, "bench/_flow_child.py", child_spec, workers, pyspy=pyspy, child_env=child_env
        )

    def config(
        self,
        name: str,
        prompts: Path,
        *,
        workers: int,
        batch_size: int,
        model: str,
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The flow options of a run of ``prompts`` against the mock."""
        return {
            "dataset_file": str(prompts),
            "batch_size": batch_size,
            "run_name": name,
            "distribution": DIST,
            "model": model,
            "base_url": self.mock.base_url,
            "num_workers": workers,
            "output_dir": str(self.root / "runs"),
            **(options or {}),
        }

    def core(self, name: str, prompts: Path, n: int, *, workers: int, model: str) -> dict[str, Any]:
        """The agent core alone on the same prompts (bench/_core_child.py): its CPU per prompt, no orchestration."""
        warmup = min(4, n // 4)
        config = self.config(name, prompts, workers=workers, batch_size=n, model=model)
        child = run_child(
            ["bench/_core_child.py", json.dumps({"config": config, "warmup": warmup})],
            self.child_env,
            self.root / "logs" / f"{name}.log",
        )
        r = child.result
        return {
            "prompts": r["prompts"],
            "failed": r["failed"],
            "wall_s": r["core_wall_s"],
            "cpu_ms_per_prompt": round(1000 * r["core_cpu_s"] / max(1, r["prompts"]), 2),
        }

    def floor(
        self,
        n: int,
        workers: int,
        sleep_s: float,
        persist: bool,
        like_prompt: bool = False,
        with_core: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Prefect's own per-task cost: a flow of n trivial tasks (bench/_floor_child.py).

        ``like_prompt``: the tasks get the prompt task's Prefect options and an ~11 KB result.
        ``with_core``: the flow config (:meth:`config`) whose prompts the agent core runs in the
        same process meanwhile (the floor under the agent's load on one GIL).
        """
        spec = {
            "n": n,
            "workers": workers,
            "sleep_s": sleep_s,
            "persist": persist,
            "like_prompt": like_prompt,
        }
        if with_core:
            spec["with_core"] = {"config": with_core, "warmup": min(4, n // 4)}
        name = (
            f"floor-w{workers}"
            + ("-like-prompt" if like_prompt else "")
            + ("-with-core" if with_core else "")
        )
        r = self.measure(name, n, "bench/_floor_child.py", spec, workers)
        r["persist_result"] = persist
        r["like_prompt"] = like_prompt
        r["with_core"] = bool(with_core)
        r["sleep_s"] = sleep_s
        r["ideal_s"] = round(n * sleep_s / workers, 2)
        r["efficiency"] = round(r["ideal_s"] / r["wall_s"], 3)
        return r

    def measure(
        self,
        name: str,
        n: int,
        script: str,
        child_spec: dict[str, Any],
        workers: int,
        *,
        pyspy: Path | None = None,
        child_env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Run a flow child, then wait for the server to ingest its events; CPU and memory figures."""
        exit_file = self.root / "logs" / f"{name}.exit.json"
        exit_file.unlink(missing_ok=True)
        child_spec = {**child_spec, "exit_file": str(exit_file)}
        self.mock.reset()
        env = {
            "PREFECT_API_URL": self.server.api_url,
            "PREFECT_HOME": str(self.root / "client-home"),
            **self.child_env,
            **(child_env or {}),
        }
        prefix = server_spy = None
        if pyspy:
            pyspy.mkdir(parents=True, exist_ok=True)
            spy = ["py-spy", "record", "--format", "raw", "--rate", "200", "--nonblocking"]
            spy += os.environ.get("HERMES_BENCH_PYSPY_ARGS", "").split()  # e.g. --gil
            prefix = [*spy, "-o", str(pyspy / "flow.txt"), "--"]
            server_spy = subprocess.Popen(
                [*spy, "--subprocesses", "-o", str(pyspy / "server.txt"), "-p", str(self.server.proc.pid)],
                stdout=subprocess.DEVNULL,
                stderr=open(pyspy / "server-spy.log", "wb"),
            )
        s0, t0, m0 = self.server.cpu(), time.monotonic(), self.mock.cpu()
        machine0 = psutil.cpu_times()
        child = run_child(
            [script, json.dumps(child_spec)], env, self.root / "logs" / f"{name}.log", prefix=prefix
        )
        mock_cpu = self.mock.cpu() - m0
        busy = _busy_since(machine0)
        waited = self.server.wait_idle()
        if server_spy is not None:
            server_spy.send_signal(signal.SIGINT)
            server_spy.wait(timeout=60)
        elapsed = time.monotonic() - t0
        server_cpu = max(0.0, self.server.cpu() - s0 - self.server.idle_rate * elapsed)
        at_exit = json.loads(exit_file.read_text()) if exit_file.exists() else {}
        r = child.result
        flow_cpu = (
            at_exit.get("cpu_at_exit", r["cpu_before_flow_s"] + r["flow_cpu_s"]) - r["cpu_before_flow_s"]
        )
        requests = self.mock.requests()
        return {
            "n": n,
            "workers": workers,
            "wall_s": r["flow_wall_s"],
            "import_s": r["import_s"],
            "state": r["state"],
            "model_requests": requests,
            "flow_cpu_s": round(flow_cpu, 3),
            "flow_cpu_during_flow_s": r["flow_cpu_s"],
            "server_cpu_s": round(server_cpu, 3),
            "server_ingest_wait_s": round(waited, 1),
            "orchestration_cpu_ms_per_prompt": round(1000 * (flow_cpu + server_cpu) / n, 2),
            "flow_cpu_ms_per_prompt": round(1000 * flow_cpu / n, 2),
            "server_cpu_ms_per_prompt": round(1000 * server_cpu / n, 2),
            # the flow process's garbage collections (all generations), part of its CPU
            "flow_gc_ms_per_prompt": round(1000 * sum(r.get("gc_s", [0.0])) / n, 2),
            "flow_gc_collections": r.get("gc_collections"),
            "peak_rss_mb": max(r["peak_rss_mb"], at_exit.get("peak_rss_mb", 0)),
            "peak_rss_prompt_phase_mb": r.get("peak_rss_prompt_phase_mb"),
            "mock_cpu_ms_per_prompt": round(1000 * mock_cpu / n, 2),
            "tool_subprocess_cpu_ms_per_prompt": round(1000 * at_exit.get("children_cpu_s", 0) / n, 2),
            "machine_cpu_busy_s": round(busy, 1),
            "machine_cpu_utilisation": round(busy / (child.wall_s * (os.cpu_count() or 1)), 3),
            **({"shared_limit_calls": r["shared_limit_calls"]} if "shared_limit_calls" in r else {}),
        }

    def baseline(
        self, name: str, prompts: Path, n: int, *, workers: int, batch_size: int, model: str
    ) -> dict[str, Any]:
        """The same prompts through bench/baseline_reference.py in a child process."""
        out_dir = self.root / "runs" / name
        if out_dir.exists():
            shutil.rmtree(out_dir)
        self.mock.reset()
        spec = {
            "dataset": str(prompts),
            "out_dir": str(out_dir),
            "num_workers": workers,
            "batch_size": batch_size,
            "model": model,
            "base_url": self.mock.base_url,
            "distribution": DIST,
        }
        m0, machine0 = self.mock.cpu(), psutil.cpu_times()
        child = run_child(
            ["bench/baseline_reference.py", json.dumps(spec)], {}, self.root / "logs" / f"{name}.log"
        )
        mock_cpu = self.mock.cpu() - m0
        busy = _busy_since(machine0)
        r = child.result
        return {
            "n": n,
            "workers": workers,
            "wall_s": r["wall_s"],
            "processed": r["processed"],
            "failed": r["failed"],
            "model_requests": self.mock.requests(),
            "agent_core_cpu_ms_per_prompt": round(1000 * r["workers_cpu_s"] / n, 2),
            "mock_cpu_ms_per_prompt": round(1000 * mock_cpu / n, 2),
            "machine_cpu_utilisation": round(busy / (child.wall_s * (os.cpu_count() or 1)), 3),
        }


def _busy_since(before: Any) -> float:
    """Machine-wide busy CPU seconds (all processes, all cores) since ``before`` (``psutil.cpu_times()``)."""
    after = psutil.cpu_times()
    return sum(getattr(after, k) - getattr(before, k) for k in ("user", "system", "nice", "irq", "softirq"))


def scaling(
    bench: Bench,
    workers: list[int],
    per_worker: int,
    latency_ms: int,
    baseline: bool,
    max_n: int | None = None,
    concurrency_limit: str | None = None,
) -> list[dict]:
    """Fixed latency at each W: ours and the baseline.

    With ``concurrency_limit`` (a global concurrency limit's name), ours runs a second time with
    ``--concurrency_limit`` (created with :data:`SHARED_LIMIT_SLOTS` slots: it never throttles, the
    figures are the mechanism's cost): ``row["with_concurrency_limit"]`` has its wall time,
    efficiency, CPU per prompt and the server calls per prompt the prompt tasks made for slots.
    """
    model = f"mock/scripted?latency_ms={latency_ms}&turns=2"
    rows = []
    for w in workers:
        n = min(per_worker * w, max_n or per_worker * w)
        batch = n // w  # one batch per baseline worker: the baseline's best case with fixed latency
        prompts = bench.root / "datasets" / f"fixed-{n}.jsonl"
        write_prompts(prompts, n)
        ideal = n * CALLS_PER_PROMPT * latency_ms / 1000 / w
        log(f"fixed latency W={w} N={n}: ours")
        ours = bench.ours(f"fixed-w{w}", prompts, n, workers=w, batch_size=batch, model=model)
        ours["ideal_s"] = round(ideal, 2)
        ours["efficiency"] = round(ideal / ours["wall_s"], 3)
        ours["prompts_per_s"] = round(n / ours["wall_s"], 2)
        log(f"fixed latency W={w} N={n}: the agent core alone")
        core = bench.core(f"core-w{w}", prompts, n, workers=w, model=model)
        ours["agent_core_cpu_ms_per_prompt"] = core["cpu_ms_per_prompt"]
        ours["orchestration_net_cpu_ms_per_prompt"] = round(
            ours["orchestration_cpu_ms_per_prompt"] - core["cpu_ms_per_prompt"], 2
        )
        row: dict[str, Any] = {"workers": w, "n": n, "ours": ours, "core": core}
        if concurrency_limit:
            log(f"fixed latency W={w} N={n}: ours with --concurrency_limit {concurrency_limit}")
            options = {"concurrency_limit": concurrency_limit, "concurrency_limit_slots": SHARED_LIMIT_SLOTS}
            shared = bench.ours(
                f"fixed-w{w}-gcl", prompts, n, workers=w, batch_size=batch, model=model, options=options
            )
            shared["ideal_s"] = round(ideal, 2)
            shared["efficiency"] = round(ideal / shared["wall_s"], 3)
            shared["prompts_per_s"] = round(n / shared["wall_s"], 2)
            calls = shared.get("shared_limit_calls", {})
            shared["server_calls_per_prompt"] = round(sum(calls.values()) / n, 3)
            shared["efficiency_change"] = round(shared["efficiency"] - ours["efficiency"], 3)
            shared["cpu_ms_per_prompt_change"] = round(
                shared["orchestration_cpu_ms_per_prompt"] - ours["orchestration_cpu_ms_per_prompt"], 2
            )
            row["with_concurrency_limit"] = shared
        if baseline:
            log(f"fixed latency W={w} N={n}: baseline")
            base = bench.baseline(
                f"fixed-w{w}-baseline", prompts, n, workers=w, batch_size=batch, model=model
            )
            base["efficiency"] = round(ideal / base["wall_s"], 3)
            base["prompts_per_s"] = round(n / base["wall_s"], 2)
            row["baseline"] = base
            row["ratio_ours_over_baseline"] = round(base["wall_s"] / ours["wall_s"], 3)
        rows.append(row)
        log(json.dumps(row))
    return rows


def heavy_tail(bench: Bench, n: int, fast_ms: int, slow_ms: int, baseline: bool) -> dict[str, Any]:
    """90% of prompts at fast_ms per call, 10% at slow_ms; W = 16, batch_size = 10."""
    workers, batch_size = 16, 10
    prompts = bench.root / "datasets" / f"heavy-{n}.jsonl"
    slow = write_prompts(prompts, n, slow_fraction=0.1, slow_ms=slow_ms)
    model = f"mock/scripted?latency_ms={fast_ms}&turns=2"
    mean_prompt_s = CALLS_PER_PROMPT * ((n - len(slow)) * fast_ms + len(slow) * slow_ms) / 1000 / n
    ideal = n * mean_prompt_s / workers
    log(f"heavy tail W={workers} N={n} ({len(slow)} slow): ours")
    ours = bench.ours("heavy", prompts, n, workers=workers, batch_size=batch_size, model=model)
    ours["efficiency"] = round(ideal / ours["wall_s"], 3)
    ours["prompts_per_s"] = round(n / ours["wall_s"], 2)
    result: dict[str, Any] = {
        "n": n,
        "workers": workers,
        "batch_size": batch_size,
        "slow_prompts": len(slow),
        "fast_ms": fast_ms,
        "slow_ms": slow_ms,
        "ideal_s": round(ideal, 2),
        "ours": ours,
    }
    if baseline:
        log("heavy tail: baseline")
        base = bench.baseline(
            "heavy-baseline", prompts, n, workers=workers, batch_size=batch_size, model=model
        )
        base["efficiency"] = round(ideal / base["wall_s"], 3)
        base["prompts_per_s"] = round(n / base["wall_s"], 2)
        result["baseline"] = base
        result["throughput_ratio_ours_over_baseline"] = round(base["wall_s"] / ours["wall_s"], 3)
    log(json.dumps(result))
    return result


def memory(bench: Bench, sizes: list[int], latency_ms: int) -> list[dict[str, Any]]:
    """Peak RSS of the flow process at W = 256 for each N."""
    model = f"mock/scripted?latency_ms={latency_ms}&turns=2"
    rows = []
    for n in sizes:
        prompts = bench.root / "datasets" / f"memory-{n}.jsonl"
        write_prompts(prompts, n)
        log(f"memory W=256 N={n}")
        trace = (
            str(bench.root / f"memory-{n}.tracemalloc")
            if os.environ.get("HERMES_BENCH_TRACEMALLOC")
            else None
        )
        r = bench.ours(f"memory-{n}", prompts, n, workers=256, batch_size=100, model=model, tracemalloc=trace)
        r["prompts_per_s"] = round(n / r["wall_s"], 2)
        rows.append(r)
        log(json.dumps(r))
    return rows


def experiments(bench: Bench, spec: str, w: int, per_worker: int, latency_ms: int) -> list[dict[str, Any]]:
    """Our run at W with each variant (patches of a private copy and/or child environment), plus as-is."""
    n = per_worker * w
    prompts = bench.root / "datasets" / f"fixed-{n}.jsonl"
    write_prompts(prompts, n)
    model = f"mock/scripted?latency_ms={latency_ms}&turns=2"
    rows = []
    for variant in ["as-is=", *spec.split(";")]:
        name, _, body = variant.partition("=")
        patches, env, options = [], {}, {}
        for item in filter(None, body.split("+")):
            key, eq, value = item.partition("=")
            if key.startswith("option."):  # a flow option, e.g. option.task_runner=dask
                options[key.removeprefix("option.")] = int(value) if value.isdigit() else value
            elif eq:
                env[key] = value
            else:
                patches.append(key)
        log(f"experiment {name}: patches {patches} env {env}")
        r = bench.ours(
            f"exp-{name}",
            prompts,
            n,
            workers=w,
            batch_size=per_worker,
            model=model,
            patches=patches,
            child_env=env,
            options=options,
        )
        r["variant"] = name
        rows.append(r)
        log(json.dumps(r))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, start the services, run the selected parts, print and save the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes (N at most 1024, memory N = 1000, 5000)",
    )
    p.add_argument("--workers", default="4,16,64,256", help="comma list of W")
    p.add_argument("--per-worker", type=int, default=8, help="N = per_worker x W (default 8)")
    p.add_argument(
        "--max-n",
        type=int,
        default=None,
        help="cap of N in the scaling runs (quick: 1024, i.e. N = 4 x W at W = 256)",
    )
    p.add_argument("--latency-ms", type=int, default=1000, help="fixed latency per model call")
    p.add_argument(
        "--heavy-n", type=int, default=None, help="prompts of the heavy-tailed mix (default 8 x 16 = 128)"
    )
    p.add_argument("--heavy-fast-ms", type=int, default=500)
    p.add_argument("--heavy-slow-ms", type=int, default=5000)
    p.add_argument(
        "--memory-n", default=None, help="comma list of N at W=256 (default 1000,10000; quick 1000,5000)"
    )
    p.add_argument("--memory-latency-ms", type=int, default=100)
    p.add_argument("--parts", default="scaling,heavy,floor,memory", help="which parts to run")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument(
        "--concurrency_limit",
        default=None,
        metavar="NAME",
        help="scaling: run ours again at each W with --concurrency_limit NAME (a limit of 4096 slots, "
        "created when missing) and report the efficiency and CPU with and without, and the server calls per prompt",
    )
    p.add_argument(
        "--server-env",
        default=",".join(f"{k}={v}" for k, v in TUNED_SERVER.items()),
        help="comma list of K=V settings of the Prefect server; 'default' = Prefect's defaults "
        "(default: the recommended PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE=500)",
    )
    p.add_argument(
        "--db", choices=["sqlite", "postgresql"], default="sqlite", help="the Prefect server's database"
    )
    p.add_argument(
        "--profile-w", type=int, default=None, help="profile our run at this W (pyinstrument html)"
    )
    p.add_argument(
        "--pyspy-w", type=int, default=None, help="py-spy our run at this W (flow process and server)"
    )
    p.add_argument(
        "--child-env", default="", help="comma list of K=V for every flow process (e.g. MALLOC_ARENA_MAX=2)"
    )
    p.add_argument("--pyspy-patches", default="", help="comma list of patches for the py-spy run")
    p.add_argument(
        "--experiments",
        default=None,
        help="semicolon list of NAME=patch+patch|ENV=VALUE|option.NAME=VALUE+... variants to compare at the first W "
        "(see bench/_flow_child.py apply_patches; option.* are flow options), e.g. "
        "'pickle=pickle;nolog=PREFECT_LOGGING_TO_API_ENABLED=false;dask=option.task_runner=dask+option.dask_workers=2'",
    )
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    per_worker = args.per_worker
    max_n = args.max_n or (1024 if args.quick else None)
    heavy_n = args.heavy_n or 8 * 16  # N = 8 x W, as the fixed-latency runs
    memory_n = [int(x) for x in (args.memory_n or ("1000,5000" if args.quick else "1000,10000")).split(",")]
    parts = set(args.parts.split(","))
    root = WORK / "throughput"
    root.mkdir(parents=True, exist_ok=True)
    (root / "client-home").mkdir(exist_ok=True)

    figures: dict[str, Any] = {
        "per_worker": per_worker,
        "max_n": max_n,
        "latency_ms": args.latency_ms,
        "distribution": DIST,
    }
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(PrivatePostgres(root / "pg")) if args.db == "postgresql" else None
        mock = stack.enter_context(MockModel(root / "logs" / "mock.log"))
        server_env = dict(
            item.split("=", 1) for item in args.server_env.split(",") if item and item != "default"
        )
        server = stack.enter_context(PrefectServer(root / "server-home", pg, env=server_env))
        figures["server_env"] = server_env
        figures["database"] = server.database
        child_env = dict(item.split("=", 1) for item in args.child_env.split(",") if item)
        figures["child_env"] = child_env
        bench = Bench(mock, server, root, child_env)
        log(f"prefect server {server.api_url} ({server.database}); mock {mock.base_url}; warming up")
        warm = root / "datasets" / "warm.jsonl"
        write_prompts(warm, 4)
        bench.ours("warmup", warm, 4, workers=4, batch_size=4, model="mock/scripted?turns=2")
        idle = server.measure_idle()
        figures["server_idle_cpu_rate"] = round(idle, 4)
        log(f"server idle CPU rate {idle:.3f} s/s")
        workers = [int(x) for x in args.workers.split(",")]
        if "scaling" in parts:
            figures["scaling"] = scaling(
                bench,
                workers,
                per_worker,
                args.latency_ms,
                not args.no_baseline,
                max_n,
                args.concurrency_limit,
            )
        if "heavy" in parts:
            figures["heavy_tail"] = heavy_tail(
                bench, heavy_n, args.heavy_fast_ms, args.heavy_slow_ms, not args.no_baseline
            )
        if "floor" in parts:
            figures["prefect_floor"] = []
            for w in [64] if args.quick else [x for x in workers if x >= 64]:
                log(f"prefect floor W={w}")
                r = bench.floor(per_worker * w, w, CALLS_PER_PROMPT * args.latency_ms / 1000, True)
                figures["prefect_floor"].append(r)
                log(json.dumps(r))
                like = bench.floor(per_worker * w, w, CALLS_PER_PROMPT * args.latency_ms / 1000, True, True)
                figures.setdefault("prefect_floor_like_prompt", []).append(like)
                log(json.dumps(like))
                # the floor sharing its process (one GIL) with the agent core, as a flow run does
                n = per_worker * w
                prompts = root / "datasets" / f"fixed-{n}.jsonl"
                write_prompts(prompts, n)
                model = f"mock/scripted?latency_ms={args.latency_ms}&turns=2"
                core = bench.config(f"core-shared-w{w}", prompts, workers=w, batch_size=n, model=model)
                shared = bench.floor(
                    n, w, CALLS_PER_PROMPT * args.latency_ms / 1000, True, True, with_core=core
                )
                figures.setdefault("prefect_floor_with_core", []).append(shared)
                log(json.dumps(shared))
        if "memory" in parts:
            figures["memory"] = memory(bench, memory_n, args.memory_latency_ms)
        if args.profile_w:
            n = per_worker * args.profile_w
            prompts = root / "datasets" / f"fixed-{n}.jsonl"
            write_prompts(prompts, n)
            html = str(root / f"profile-w{args.profile_w}.html")
            model = f"mock/scripted?latency_ms={args.latency_ms}&turns=2"
            bench.ours(
                f"profile-w{args.profile_w}",
                prompts,
                n,
                workers=args.profile_w,
                batch_size=per_worker,
                model=model,
                profile=html,
            )
            log(f"profile written to {html}")
        if args.experiments:
            figures["experiments"] = experiments(
                bench, args.experiments, workers[0], per_worker, args.latency_ms
            )
        if args.pyspy_w:
            n = per_worker * args.pyspy_w
            prompts = root / "datasets" / f"fixed-{n}.jsonl"
            write_prompts(prompts, n)
            folder = root / f"pyspy-w{args.pyspy_w}"
            model = f"mock/scripted?latency_ms={args.latency_ms}&turns=2"
            bench.ours(
                f"pyspy-w{args.pyspy_w}",
                prompts,
                n,
                workers=args.pyspy_w,
                batch_size=per_worker,
                model=model,
                pyspy=folder,
                patches=[x for x in args.pyspy_patches.split(",") if x],
            )
            log(f"py-spy profiles in {folder} (summarise with bench/_pyspy.py)")
        figures["server_peak_rss_mb"] = round(server.rss_mb(), 1)
    print_figures(figures)
    if args.json:
        save_json(Path(args.json), figures)
    return 0


def print_figures(f: dict[str, Any]) -> None:
    """The figures as plain tables on stdout."""
    print(
        f"database: {f.get('database')}; latency {f['latency_ms']} ms x {CALLS_PER_PROMPT} calls per prompt"
    )
    if "scaling" in f:
        print(f"{'W':>4} {'N':>6} {'ideal':>6} {'wall':>7} {'p/s':>7} {'eff':>6} {'orch ms/p':>10} "
              f"{'flow':>6} {'server':>7} {'base wall':>9} {'base eff':>8} {'ours/base':>9}")  # fmt: skip
        for row in f["scaling"]:
            o, b = row["ours"], row.get("baseline", {})
            print(
                f"{row['workers']:>4} {row['n']:>6} {o['ideal_s']:>6} {o['wall_s']:>7} {o['prompts_per_s']:>7} "
                f"{o['efficiency']:>6} {o['orchestration_cpu_ms_per_prompt']:>10} {o['flow_cpu_ms_per_prompt']:>6} "
                f"{o['server_cpu_ms_per_prompt']:>7} {b.get('wall_s', '-'):>9} {b.get('efficiency', '-'):>8} "
                f"{row.get('ratio_ours_over_baseline', '-'):>9}"
            )
        for row in f["scaling"]:
            s = row.get("with_concurrency_limit")
            if s:
                print(
                    f"{row['workers']:>4} with --concurrency_limit: efficiency {s['efficiency']} "
                    f"({s['efficiency_change']:+} against {row['ours']['efficiency']}), orchestration "
                    f"{s['orchestration_cpu_ms_per_prompt']} ms/prompt ({s['cpu_ms_per_prompt_change']:+}: flow "
                    f"{s['flow_cpu_ms_per_prompt']}, server {s['server_cpu_ms_per_prompt']}), "
                    f"{s['server_calls_per_prompt']} server calls per prompt {s.get('shared_limit_calls', {})}"
                )
    if "heavy_tail" in f:
        h = f["heavy_tail"]
        print(
            f"heavy tail W={h['workers']} N={h['n']} ({h['slow_prompts']} slow): ours {h['ours']['wall_s']} s, "
            f"baseline {h.get('baseline', {}).get('wall_s', '-')} s, throughput ours/baseline "
            f"{h.get('throughput_ratio_ours_over_baseline', '-')}"
        )
    for r in f.get("prefect_floor", []):
        print(
            f"prefect floor (N={r['n']} tasks sleeping {r['sleep_s']} s, W={r['workers']}): efficiency "
            f"{r['efficiency']}, {r['orchestration_cpu_ms_per_prompt']} ms/task (flow {r['flow_cpu_ms_per_prompt']}, "
            f"server {r['server_cpu_ms_per_prompt']})"
        )
    for e in f.get("experiments", []):
        print(
            f"experiment {e['variant']:>12}: orchestration {e['orchestration_cpu_ms_per_prompt']} ms/prompt "
            f"(flow {e['flow_cpu_ms_per_prompt']}, server {e['server_cpu_ms_per_prompt']}), wall {e['wall_s']} s"
        )
    for m in f.get("memory", []):
        print(
            f"memory W=256 N={m['n']}: peak RSS {m['peak_rss_mb']:.0f} MB (prompt phase "
            f"{m['peak_rss_prompt_phase_mb']:.0f} MB, then merge + statistics), wall {m['wall_s']} s"
        )


if __name__ == "__main__":
    raise SystemExit(main())
