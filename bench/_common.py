"""Shared pieces of the benchmarks: services in their own processes, CPU and memory probes, datasets.

Every benchmark runs the product in a *child* process so that its CPU time and peak RSS are
its own: the mock model (``python -m hermes_core.mockllm``) and the Prefect API server
(``prefect server start``) are separate processes whose CPU is read with psutil.

CPU figures are user + system seconds of one process (all its threads, none of its children:
``time.process_time()`` in the process itself, or ``psutil.Process(pid).cpu_times()``), so the
tool subprocesses that a prompt's terminal command starts are never counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("HERMES_BENCH_DIR", "/tmp/hermes-bench"))
"""Scratch folder of the benchmarks (runs, server homes, cached generated data); never committed."""
RESULT_PREFIX = "BENCH_RESULT "
"""A child process prints its figures as one line ``BENCH_RESULT {json}`` on stdout."""

BASE_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PYTHONUNBUFFERED": "1",
}


def log(msg: str) -> None:
    """Progress line on stderr (figures go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    """``proc`` and its live descendants (just ``proc`` when it is gone)."""
    procs = [proc]
    with contextlib.suppress(psutil.Error):
        procs += proc.children(recursive=True)
    return procs


def tree_cpu_seconds(proc: psutil.Process) -> float:
    """user + system seconds of ``proc`` and its live descendants (0 for a vanished process)."""
    total = 0.0
    for p in _tree(proc):
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def tree_rss_mb(proc: psutil.Process) -> float:
    """Resident memory of ``proc`` and its live descendants, MB."""
    total = 0
    for p in _tree(proc):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / 2**20


def _stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait(timeout=10)


class MockModel:
    """The mock model server in its own process (``python -m hermes_core.mockllm --port 0``).

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``.
    """

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> MockModel:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        err = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hermes_core.mockllm", "--port", "0"],
            cwd=REPO,
            env={**os.environ, **BASE_ENV},
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            text=True,
        )
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            _stop(self.proc)
            raise RuntimeError(f"mock server did not start; see {self.log_path}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base_url + "/models", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"mock server at {self.base_url} does not answer")

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def stats(self) -> dict[str, Any]:
        """``GET /stats``: ``{"requests", "by_conversation", "by_status"}``."""
        return httpx.get(self.root + "/stats", timeout=30).json()

    def requests(self) -> int:
        """Chat-completion requests received since the last reset."""
        return int(self.stats()["requests"])

    def cpu(self) -> float:
        """user + system seconds of the mock server process so far."""
        return tree_cpu_seconds(psutil.Process(self.proc.pid))

    def reset(self) -> None:
        """``POST /stats/reset`` (also clears the per-conversation counters)."""
        httpx.post(self.root + "/stats/reset", timeout=30)

    def __exit__(self, *exc: object) -> None:
        if self.proc:
            _stop(self.proc)


class PrefectServer:
    """A real ``prefect server start`` (SQLite in ``home``, or a private PostgreSQL) whose CPU can be measured.

    Attributes:
        api_url: ``http://127.0.0.1:PORT/api``.
        database: ``"sqlite"`` or ``"postgresql"``.
    """

    def __init__(
        self,
        home: Path,
        postgres: PrivatePostgres | None = None,
        fresh: bool = True,
        env: dict[str, str] | None = None,
    ):
        self.home = home
        self.env = dict(env or {})
        self.postgres = postgres
        self.db_url = postgres.url if postgres else None
        self.fresh = fresh
        self.proc: subprocess.Popen | None = None
        self.ps: psutil.Process | None = None
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.database = "postgresql" if postgres else "sqlite"
        self.idle_rate = 0.0

    def __enter__(self) -> PrefectServer:
        if self.fresh and self.home.exists():
            shutil.rmtree(self.home)
        self.home.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **BASE_ENV,
            "PREFECT_HOME": str(self.home),
            "PREFECT_UI_ENABLED": "false",
            **self.env,
        }
        env.pop("PREFECT_API_URL", None)
        if self.db_url:
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = self.db_url
        out = open(self.home / "server.log", "wb")
        prefect = shutil.which("prefect") or "prefect"
        cmd = [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(self.port), "--analytics-off"]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.api_url + "/health", timeout=2).status_code == 200:
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                _stop(self.proc)
                raise RuntimeError(f"prefect server did not start; see {self.home / 'server.log'}")
            time.sleep(0.5)
        return self

    def cpu(self) -> float:
        """user + system seconds of the server's process tree (and of its PostgreSQL) so far."""
        return tree_cpu_seconds(self.ps) + (self.postgres.cpu() if self.postgres else 0.0)

    def rss_mb(self) -> float:
        """Resident memory of the server's process tree, MB."""
        return tree_rss_mb(self.ps)

    def measure_idle(self, seconds: float = 8.0) -> float:
        """CPU seconds per second the server spends with no client (its background services)."""
        c0, t0 = self.cpu(), time.monotonic()
        time.sleep(seconds)
        self.idle_rate = (self.cpu() - c0) / (time.monotonic() - t0)
        return self.idle_rate

    def wait_idle(self, timeout: float = 180.0, quiet: float = 2.0) -> float:
        """Wait until the server has ingested what a run sent (CPU back near idle for ``quiet`` s).

        Returns the seconds waited.
        """
        t0 = time.monotonic()
        threshold = max(0.05, 3 * self.idle_rate)
        calm = 0.0
        last_cpu, last_t = self.cpu(), time.monotonic()
        while time.monotonic() - t0 < timeout:
            time.sleep(0.5)
            cpu, now = self.cpu(), time.monotonic()
            rate = (cpu - last_cpu) / (now - last_t)
            last_cpu, last_t = cpu, now
            calm = calm + 0.5 if rate < threshold else 0.0
            if calm >= quiet:
                break
        return time.monotonic() - t0

    def __exit__(self, *exc: object) -> None:
        if self.proc:
            _stop(self.proc)


class PrivatePostgres:
    """A throw-away PostgreSQL cluster (Debian ``postgresql`` package) for the Prefect server, as root.

    Attributes:
        url: ``postgresql+asyncpg://postgres@127.0.0.1:PORT/prefect``.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/prefect"
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not bins:
            raise RuntimeError("PostgreSQL is not installed (apt-get install -y postgresql)")
        self.bin = bins[-1].parent

    def _as_postgres(self, *cmd: str) -> None:
        line = " ".join(f"'{c}'" for c in cmd)
        subprocess.run(["su", "postgres", "-c", line], check=True, capture_output=True)

    def __enter__(self) -> PrivatePostgres:
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        shutil.chown(self.folder, "postgres")
        data = self.folder / "data"
        self._as_postgres(str(self.bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
        opts = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=300"
        line = f"{self.bin / 'pg_ctl'} -D {data} -o '{opts}' -l {self.folder / 'log'} -w start"
        subprocess.run(["su", "postgres", "-c", line], check=True, capture_output=True)
        subprocess.run(
            [
                str(self.bin / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "prefect",
            ],
            check=True,
            capture_output=True,
        )
        return self

    def cpu(self) -> float:
        """user + system seconds of every postgres process of this cluster (live ones)."""
        total = 0.0
        for p in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if p.info["name"] and p.info["name"].startswith("postgres") and self._mine(p):
                    t = p.cpu_times()
                    total += t.user + t.system
        return total

    def _mine(self, p: psutil.Process) -> bool:
        try:
            return str(self.folder) in " ".join(p.cmdline()) or any(
                str(self.folder) in " ".join(a.cmdline()) for a in p.parents()
            )
        except psutil.Error:
            return False

    def __exit__(self, *exc: object) -> None:
        line = f"{self.bin / 'pg_ctl'} -D {self.folder / 'data'} stop -m fast"
        subprocess.run(["su", "postgres", "-c", line], capture_output=True)


@dataclass
class ChildResult:
    """What a benchmark child process reported, plus what the parent saw of it."""

    result: dict[str, Any]
    returncode: int
    wall_s: float
    cpu_polled: float
    peak_rss_polled_mb: float
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)


def run_child(
    args: list[str],
    env: dict[str, str],
    log_path: Path,
    timeout: float = 3600,
    prefix: list[str] | None = None,
) -> ChildResult:
    """Run ``python <args>`` from the repository, poll its CPU and RSS, parse its ``BENCH_RESULT`` line.

    ``prefix`` is put before ``python`` (e.g. a ``py-spy record ... --`` command line); the polled
    figures are then those of the prefix's process.

    Raises:
        RuntimeError: the child printed no result line (its output is in ``log_path``).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **BASE_ENV, **env}
    t0 = time.monotonic()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [*(prefix or []), sys.executable, *args],
            cwd=REPO,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=out,
            start_new_session=True,
        )
        ps = psutil.Process(proc.pid)
        cpu = rss = 0.0
        lines: list[bytes] = []
        import threading

        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                t = ps.cpu_times()
                cpu = t.user + t.system
                rss = max(rss, ps.memory_info().rss / 2**20)
            if time.monotonic() - t0 > timeout:
                _stop(proc)
                break
            time.sleep(0.2)
        reader.join(timeout=10)
    wall = time.monotonic() - t0
    with open(log_path, "ab") as out:
        out.writelines(lines)
    for raw in reversed(lines):
        line = raw.decode("utf-8", "replace")
        if line.startswith(RESULT_PREFIX):
            return ChildResult(
                json.loads(line[len(RESULT_PREFIX) :]), proc.returncode, wall, cpu, rss, log_path
            )
    raise RuntimeError(f"child {' '.join(args[:2])} gave no result (exit {proc.returncode}); see {log_path}")


def emit(result: dict[str, Any]) -> None:
    """Print the child's result line (see :data:`RESULT_PREFIX`)."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MB (``ru_maxrss``; Linux reports KB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_prompts(
    path: Path, n: int, *, slow_fraction: float = 0.0, slow_ms: int = 0, seed: int = 7
) -> list[int]:
    """Write ``n`` distinct prompts as JSONL; a seeded ``slow_fraction`` of them get ``[mock:latency_ms=slow_ms]``.

    Returns the indices of the slow prompts.
    """
    slow: set[int] = set()
    if slow_fraction > 0:
        slow = set(random.Random(seed).sample(range(n), round(n * slow_fraction)))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            text = f"Task {i}: list the working directory and report what you find"
            if i in slow:
                text += f" [mock:latency_ms={slow_ms}]"
            fh.write(json.dumps({"prompt": text, "task_id": i}) + "\n")
    return sorted(slow)


def machine() -> dict[str, Any]:
    """CPU model, cores, memory, OS, Python and Prefect versions, load average now."""
    cpu_model = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    try:
        from importlib.metadata import version

        prefect_version = version("prefect")
    except Exception:  # noqa: BLE001 - informative only
        prefect_version = "?"
    return {
        "cpu": cpu_model,
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "prefect": prefect_version,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def git_commit() -> str:
    """``HEAD`` commit of the repository (+ ``-dirty`` when files are modified), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def now_utc() -> str:
    """Current UTC time, ISO-8601 to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@contextlib.contextmanager
def timed() -> Iterator[dict[str, float]]:
    """``with timed() as t: ...`` then ``t["s"]`` is the wall seconds of the block."""
    box: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box["s"] = time.perf_counter() - t0


def save_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON (the figures of one benchmark, read by run_all.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


class GcTime:
    """Time spent in Python's garbage collector from :meth:`install` on, by generation (``gc.callbacks``).

    A collection holds the GIL from its start to its end, so its wall time is CPU time taken from
    every thread of the process. :meth:`figures`: ``gc_s`` (seconds, generations 0-2) and
    ``gc_collections`` (counts).
    """

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self._start: float | None = None

    def install(self) -> GcTime:
        import gc

        gc.callbacks.append(self._callback)
        return self

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        import time

        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            generation = info["generation"]
            self.seconds[generation] += time.perf_counter() - self._start
            self.counts[generation] += 1
            self._start = None

    def figures(self) -> dict[str, Any]:
        return {"gc_s": [round(s, 3) for s in self.seconds], "gc_collections": list(self.counts)}
