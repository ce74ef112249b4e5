"""Adaptive concurrency against a provider's concurrency limit: 429 answers and throughput, on vs off.

The mock model (in this process, real HTTP) refuses requests beyond ``--limit`` in flight with
429 + ``Retry-After: 1`` (``mock/scripted?max_in_flight=K``) and answers the others after
``--latency_ms``. The command line runs ``--prompts`` prompts (3 requests each) with
``--num_workers`` workers, once with ``--adaptive_concurrency=true`` and once ``false``, each on
Prefect's local API, with the client's default 5 retries. Reported per mode: exit code, prompts
completed, 429 answers, served requests, wall time of the request window (first to last request
in the mock's log) and its throughput as a fraction of what ``limit`` requests in flight allow.

    python bench/adaptive_concurrency.py [--prompts 48] [--num_workers 16] [--limit 4] [--latency_ms 400]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hermes_core.mockllm import MockServer  # noqa: E402
from hermes_core.runfolder.folder import RunFolder  # noqa: E402


def run(mode: bool, args: argparse.Namespace, work: Path) -> dict:
    """One CLI run against a fresh mock server; the figures of its request log."""
    log = work / f"requests-{mode}.jsonl"
    dataset = work / "dataset.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"prompt": f"bench limited prompt {i}: list files"}) + "\n"
            for i in range(args.prompts)
        )
    )
    model = f"mock/scripted?max_in_flight={args.limit}&latency_ms={args.latency_ms}&retry_after=1"
    with MockServer(request_log=str(log)) as server:
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env["PREFECT_HOME"] = str(work / f"prefect-{mode}")
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(REPO / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=8",
             f"--run_name=bench-{mode}", f"--model={model}", "--base_url", server.base_url,
             "--distribution=terminal_only", f"--num_workers={args.num_workers}",
             f"--adaptive_concurrency={str(mode).lower()}", f"--output_dir={work / 'data'}"],
            cwd=work, env=env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    times = sorted(datetime.fromisoformat(line["time"]).timestamp() for line in lines)
    served = sum(1 for line in lines if line["status"] == 200)
    refused = sum(1 for line in lines if line["status"] == 429)
    window = times[-1] - times[0]
    traj = RunFolder(work / "data" / f"bench-{mode}").trajectories
    completed = len(traj.read_text().splitlines()) if traj.exists() else 0
    ideal = args.limit / (args.latency_ms / 1000)
    return {
        "adaptive": mode,
        "exit": proc.returncode,
        "completed": completed,
        "served": served,
        "429": refused,
        "429_per_served": round(refused / max(served, 1), 3),
        "window_s": round(window, 2),
        "requests_per_s": round(served / window, 2),
        "fraction_of_limit": round(served / window / ideal, 3),
        "cli_s": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--num_workers", type=int, default=16)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--latency_ms", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as tmp:
        for mode in (True, False):
            print(json.dumps(run(mode, args, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
