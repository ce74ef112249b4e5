"""Shared fixtures: the mock model server over real HTTP, the session's Prefect server, the ``cli`` runner, the
deployment ``stack``, a clean environment for Prefect; and the hook that marks tests ``slow`` / ``exclusive``."""

from __future__ import annotations

import contextlib
import os

import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


VENDOR_VARIABLES = (
    "FIRECRAWL_", "TAVILY_", "SEARXNG_", "FAL_", "HERMES_IMAGE_", "HERMES_VISION_", "HERMES_MOA_",
    "HERMES_WEB_BACKEND", "HERMES_BROWSER_", "AUXILIARY_VISION_MODEL",
)  # fmt: skip
"""Prefixes of the backend variables a developer's shell may hold: tests start without them."""


EXCLUSIVE_FILES = frozenset({"test_sandbox_boundary.py", "test_flow_memory.py"})
"""Test files marked ``exclusive``, matched by file name wherever they sit under ``tests/`` (today
``tests/hermes_core/environments/`` and ``tests/flows/``): they need the machine to themselves. The
network boundary tests (network namespaces at fixed addresses, veth pairs, slirp4netns: beside other
pytest-xdist workers ``ip netns exec`` failed with EINVAL) and the flow's memory measurement (traced
bytes per prompt, which a loaded Prefect server inflates with queued logs and events: 4.5 KB once
beside other workers, 0.5-2.9 KB alone). ``bash .ci/run`` runs them in a second, single-process
pytest after the parallel one (``-m exclusive``)."""


def exclusive_test_files(root: str = "tests") -> list[str]:
    """Paths (sorted, relative to the working directory) of the test files under ``root`` whose name is
    in :data:`EXCLUSIVE_FILES`: what ``.ci/run`` hands its exclusive phase."""
    from pathlib import Path

    return [str(p) for p in sorted(Path(root).rglob("test_*.py")) if p.name in EXCLUSIVE_FILES]


DOCKER_ENGINE_FILES = frozenset(
    {"test_docker_pool.py", "test_docker_environment.py", "test_sandboxes_docker_flow.py"}
)
"""Test files that use the one Docker engine of ``.ci/docker-up.sh``: one pytest-xdist group
(``docker-engine``), so they run one after another in one worker, beside the other workers' tests.
Each counts and reaps only its own containers (by run name, run id or flow run id). They need the
test images, which build in the background during the first minutes (they wait for them). They
shared the machine safely once the engine ran in its own mount namespace (``.ci/docker-up.sh``):
before, bubblewrap sandboxes started meanwhile copied the containers' overlay mounts and some new
containers started without their root filesystem."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark every test that starts a Prefect server (the ``prefect_server`` or ``cli`` fixture) ``slow``, the
    tests of :data:`EXCLUSIVE_FILES` ``exclusive``, put the tests of :data:`DOCKER_ENGINE_FILES` in one
    pytest-xdist group (``--dist loadgroup``) and mark them ``slow`` (they need the Docker engine), and
    put those of each deployment ``stack`` (one per database) in one group each, so that each stack
    starts once and the two run side by side, and put the ``waits`` tests first.

    The ``waits`` tests mostly wait on a clock they cannot shorten (Prefect's shortest lease, 60 s):
    collected first, pytest-xdist hands them out among its first tests (after the groups, which it
    sends first, largest first), so that their wait overlaps the other workers' tests instead of
    being the suite's last minute with the machine idle.

    Runs before pytest's ``-m`` selection (tryfirst).
    """
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if "prefect_server" in used and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if item.path.name in EXCLUSIVE_FILES:
            item.add_marker(pytest.mark.exclusive)
        if item.path.name in DOCKER_ENGINE_FILES:
            item.add_marker(pytest.mark.xdist_group("docker-engine"))
            if not item.get_closest_marker("slow"):  # they need the engine: not in the fast tier
                item.add_marker(pytest.mark.slow)
        if "stack" in used:  # one worker starts each deployment stack once (tests/prefect_stack.py)
            database = item.callspec.params.get("stack", "") if hasattr(item, "callspec") else ""
            item.add_marker(pytest.mark.xdist_group(f"prefect-stack-{database}"))
    items.sort(key=lambda item: item.get_closest_marker("waits") is None)  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _isolated_backends(monkeypatch):
    """Every test sees no ambient web, image, vision, moa or browser backend configuration."""
    for name in list(os.environ):
        if name.startswith(VENDOR_VARIABLES):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def mock_server():
    """One mock model server (real uvicorn on 127.0.0.1) for the whole session."""
    from hermes_core.mockllm import MockServer

    with MockServer() as server:
        yield server


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie left for a non-reaping init counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def wait_dead(pid: int, seconds: float = 3.0) -> bool:
    """Wait up to ``seconds`` for ``pid`` to end; True when it did."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end and process_alive(pid):
        time.sleep(0.05)
    return not process_alive(pid)


def wait_until(condition, seconds: float, what: str = "the condition", interval: float = 0.02) -> float:
    """Poll ``condition()`` until it is true; returns the seconds waited. Fails after ``seconds``."""
    import time

    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, f"timed out after {seconds} s waiting for {what}"
        time.sleep(interval)
    return time.monotonic() - start


def host_pids_with(text: str) -> list[int]:
    """Host pids of live processes whose command line (arguments joined by NUL) contains ``text``.

    Sees processes inside bubblewrap sandboxes too (they are in a child pid namespace).
    """
    needle = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if needle in cmdline and process_alive(int(entry)):
            found.append(int(entry))
    return found


def run_args(dataset, run: str, server, *extra: str, model: str = "mock/scripted") -> list[str]:
    """Command-line arguments of a small test run against the mock ``server`` (batch_size 2, terminal_only)."""
    return [
        f"--dataset_file={dataset}",
        "--batch_size=2",
        f"--run_name={run}",
        f"--model={model}",
        "--base_url",
        server.base_url,
        "--distribution=terminal_only",
        *extra,
    ]


def conversation_key(prompt: str) -> str:
    """The mock server's key of a conversation: sha256 of its first user message, 16 hex chars."""
    import hashlib

    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def model_requests(server, prompt: str) -> int:
    """How many requests the mock ``server`` answered for the conversation that began with ``prompt``."""
    return server.stats()["by_conversation"].get(conversation_key(prompt), 0)


def write_prompts(path, prompts: list[str], **fields):
    """Write a dataset: one JSON line ``{"prompt": p, **fields}`` per prompt to ``path``; returns ``path``."""
    import json

    path.write_text("".join(json.dumps({"prompt": p, **fields}) + "\n" for p in prompts), encoding="utf-8")
    return path


def tool_responses(row: dict) -> list:
    """Every tool response of a trajectory row, in order: ``hermes_core.sharegpt_parse.ToolResponse``
    (``tool_call_id``, ``name``, ``content``), parsed as the product parses its own trajectories."""
    from hermes_core.sharegpt_parse import parse_tool_turn

    return [
        r for turn in row["conversations"] if turn["from"] == "tool" for r in parse_tool_turn(turn["value"])
    ]


def tool_outputs(row: dict) -> list[str]:
    """The ``output`` of every tool response of a trajectory row (``""`` for a result without one)."""
    import json

    contents = [r.content for r in tool_responses(row)]
    return [(json.loads(c) if isinstance(c, str) else c).get("output", "") for c in contents]


@contextlib.contextmanager
def thread_inside(context):
    """A daemon thread that enters ``context`` (a context manager) and stays in it until the block ends.

    Stands for a prompt of this process that is still running (in ``cancel.tracked(env)``,
    ``cancel.prompt_in_flight()``): yields once the thread is inside; the thread leaves and is
    joined when the block ends, however it ends.
    """
    import threading

    entered, release = threading.Event(), threading.Event()

    def inside() -> None:
        with context:
            entered.set()
            release.wait(60)

    thread = threading.Thread(target=inside, daemon=True)
    thread.start()
    assert entered.wait(10), "the thread did not enter the context"
    try:
        yield release
    finally:
        release.set()
        thread.join(10)


def jsonl_rows(path) -> list[dict]:
    """Every line of a JSONL file, parsed (a blank or torn line fails: the run folder's files have none)."""
    import json

    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="session")
def migrated_prefect_db():
    """A Prefect SQLite database with all of Prefect's migrations applied, made once per machine and
    Prefect version.

    Kept in the temp folder (``hermes-test-prefect-db-<version>-<uid>/prefect.db``) and shared by the
    pytest-xdist workers and by later test runs, such as the second phase of ``.ci/run``: it is made by
    the first that asks, under a file lock, in a side folder renamed into place once the upgrade
    succeeded (a killed upgrade leaves nothing that a later run would take). A server on a fresh
    database spends ~6 s of CPU migrating it (9.3 s against 3.6 s for a start on 2 cores), and the
    suite starts a dozen. Tests copy it (:func:`prefect_home_from`); the tests that exercise a first
    start (the README's command) do not use it.
    """
    import fcntl
    import shutil
    import subprocess
    import tempfile
    from importlib.metadata import version
    from pathlib import Path

    shared = Path(tempfile.gettempdir()) / f"hermes-test-prefect-db-{version('prefect')}-{os.getuid()}"
    db = shared / "prefect.db"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not db.exists():
            making = Path(f"{shared}.making")
            shutil.rmtree(making, ignore_errors=True)
            making.mkdir()
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
            env["PREFECT_HOME"] = str(making)
            done = subprocess.run(
                [shutil.which("prefect"), "server", "database", "upgrade", "-y"],
                env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0 and (making / "prefect.db").exists(), (
                done.stdout[-2000:] + done.stderr[-2000:]
            )
            shutil.rmtree(shared, ignore_errors=True)
            making.rename(shared)
    return db


def prefect_home_from(template, home):
    """``home`` (made) holding a copy of the migrated database ``template``; returns ``home``."""
    import shutil

    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, home / "prefect.db")
    return home


IDLE_SERVICES = (
    "SCHEDULER", "LATE_RUNS", "PAUSE_EXPIRATIONS", "FOREMAN", "CLEANUP_RECONCILER", "CANCELLATION_CLEANUP",
)  # fmt: skip
"""Prefect server services the session's :func:`prefect_server` runs without (``PREFECT_SERVER_SERVICES_<NAME>_ENABLED``):
schedules, late and paused runs, work-pool health, worker cleanup, and cancelling the children of a cancelled
flow run after the fact. No test of that server schedules a deployment, starts a worker or pauses a run."""


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory, migrated_prefect_db):
    """A real ``prefect server`` (SQLite in a temp folder) on a free loopback port for the session.

    It runs the services its tests use (events, task-run recording, automations' triggers, the
    lease repossessor of the shared limit); those of :data:`IDLE_SERVICES` are off: they serve
    schedules, workers and pauses, which only the deployment ``stack`` (every service on) has.
    Each costs CPU on a timer (~0.8 s a minute for the six), in each of the suite's servers.

    Yields its API URL (``http://127.0.0.1:PORT/api``).
    """
    import shutil
    import subprocess
    import time

    import httpx

    home = prefect_home_from(migrated_prefect_db, tmp_path_factory.mktemp("prefect-server-home"))
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_UI_ENABLED": "false",
        **{f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in IDLE_SERVICES},
    }
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "wb")
    for _ in range(3):  # the free port may be taken before the server binds it: then another one
        port = free_port()
        proc = subprocess.Popen(
            [
                shutil.which("prefect"),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--analytics-off",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        if proc.poll() is None and time.monotonic() < deadline:
            break
        proc.kill()
        proc.wait()
        if "in use" not in (home / "server.log").read_text(errors="replace"):
            break
    else:
        raise RuntimeError(f"prefect server found its port taken three times; see {home / 'server.log'}")
    if proc.poll() is not None:
        raise RuntimeError(f"prefect server did not start; see {home / 'server.log'}")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory, migrated_prefect_db):
    """A deployment stack (:class:`tests.prefect_stack.Stack`) on SQLite or PostgreSQL, once per session.

    The SQLite one is deployed with Prefect's plain commands, the PostgreSQL one with ``deployments/deploy.sh``.
    """
    from tests.prefect_stack import Postgres, Stack

    root = tmp_path_factory.mktemp(f"stack-{request.param}")
    database = Postgres() if request.param == "postgres" else None
    url = database.start() if database else None
    if database is None:
        prefect_home_from(migrated_prefect_db, root / "prefect-home")
    deployed = Stack(root, url, plain_deploy=database is None)
    try:
        yield deployed.start()
    finally:
        deployed.stop()
        if database:
            database.stop()


@pytest.fixture
def cli(prefect_server, tmp_path):
    """Run the command line as a real subprocess against the session's Prefect server.

    Returns ``run(*args, env=None, timeout=300) -> CompletedProcess`` with cwd = a temp folder;
    ``run.spawn(*args, env=None) -> Popen`` starts it in the background in its own process group.
    """
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    client_home = tmp_path / "prefect-client-home"
    client_home.mkdir()

    def environment(env: dict | None) -> dict:
        return {
            **os.environ,
            "PREFECT_API_URL": prefect_server,
            "PREFECT_HOME": str(client_home),
            "HERMES_MAX_RETRIES": "1",
            "COLUMNS": "200",
            **(env or {}),
        }

    def run(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(repo / "batch_runner.py"), *args],
            cwd=tmp_path,
            env=environment(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def spawn(*args: str, env: dict | None = None) -> subprocess.Popen:
        """Start the command line in the background, in its own process group (output discarded)."""
        return subprocess.Popen(
            [sys.executable, str(repo / "batch_runner.py"), *args],
            cwd=tmp_path,
            env=environment(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    run.cwd = tmp_path
    run.spawn = spawn
    run.api_url = prefect_server
    return run


@pytest.fixture
def env():
    """A started local environment (a fresh working directory), closed after the test."""
    from hermes_core.environments.local import LocalEnvironment

    with LocalEnvironment() as environment:
        yield environment


@pytest.fixture(scope="module")
def site():
    """Base URL of the static test site (tests/fixtures/servers.py) served on loopback for the module."""
    from tests.fixtures.servers import static_site

    with static_site() as base:
        yield base


@pytest.fixture(scope="module")
def vendor():
    """A local HTTP server standing in for a paid vendor API (pytest-httpserver), for the module."""
    from pytest_httpserver import HTTPServer

    server = HTTPServer(host="127.0.0.1", threaded=True)
    server.start()
    yield server
    server.clear()
    server.stop()


@pytest.fixture
def api(vendor):
    """The vendor server with no expectations; after the test, every expected request must have come."""
    vendor.clear()
    yield vendor
    vendor.check_assertions()
