"""The docker backend on a real engine: container per prompt, limits, timeouts, bounded output, files, tools.

Needs the engine and the images that `.ci/docker-up.sh` starts and builds (it prints the
DOCKER_HOST to export). Without DOCKER_HOST these tests skip locally; in CI (CI=true) they fail.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time

import docker
import pytest

from hermes_core.environments import create_environment
from hermes_core.environments.docker import DockerEnvironment
from hermes_core.environments.docker_engine import (
    LABEL_PROMPT,
    LABEL_RUN,
    LABEL_RUN_ID,
    EngineUnavailable,
    ImageUnavailable,
    check_images,
    docker_client,
    reap_run_containers,
)
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, ToolContext

BUSYBOX = "hermes-test/busybox:1"
PYTHON = "hermes-test/python:bookworm"
ABSENT = "hermes-test/absent:0"


def wait_for_images(timeout: float = 900) -> None:
    """Wait while ``.ci/docker-up.sh`` builds the test images in the background (``HERMES_IMAGES_STATUS``
    says ``building``); fail when that build failed. No-op when the images were built beforehand."""
    status = os.environ.get("HERMES_IMAGES_STATUS")
    if not status:
        return
    deadline = time.monotonic() + timeout
    while (state := open(status).read().strip()) == "building":
        if time.monotonic() > deadline:
            pytest.fail(f"the test images were still building after {timeout:.0f} s: see {status}.log")
        time.sleep(1)
    if state != "ok":
        pytest.fail(f"the test images did not build ({state}): see {status}.log")


def require_engine(*more_images: str) -> docker.DockerClient:
    """The engine's client; skip without DOCKER_HOST outside CI, fail in CI or when the test images
    (busybox, Debian, and ``more_images``) are missing."""
    if not os.environ.get("DOCKER_HOST") and os.environ.get("CI", "").lower() != "true":
        pytest.skip('no DOCKER_HOST: start an engine with `eval "$(bash .ci/docker-up.sh)"`')
    wait_for_images()
    client = docker_client()
    for image in (BUSYBOX, PYTHON, *more_images):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail(f"test image {image} missing: run `bash .ci/images/build.sh`")
    return client


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    return require_engine()


def settings(**values) -> HermesSettings:
    return HermesSettings(**{"docker_pull": False, **values})


def labelled(client: docker.DockerClient, run: str, label: str = LABEL_RUN) -> list:
    """The containers whose ``label`` (default: the run name's) is ``run``.

    The SDK lists the ids, then inspects each: a container removed in between (a run reaping or
    retrying a sandbox while a test polls) is left out instead of raising NotFound.
    """
    return client.containers.list(all=True, filters={"label": f"{label}={run}"}, ignore_removed=True)


def test_container_per_prompt_with_labels_limits_cwd_and_teardown(engine):
    s = settings(container_memory_mb=256, container_cpus=0.5, container_pids_limit=64)
    env = create_environment(
        "docker", image=BUSYBOX, cwd="/app/work", settings=s, run_name="t-env", run_id="rid-1", prompt_id="p7"
    )
    assert isinstance(env, DockerEnvironment)
    with env:
        attrs = engine.containers.get(env.container_id).attrs
        assert attrs["Config"]["Labels"] == {LABEL_RUN: "t-env", LABEL_RUN_ID: "rid-1", LABEL_PROMPT: "p7"}
        host = attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert (host["Memory"], host["MemorySwap"]) == (256 * 2**20, 256 * 2**20)
        assert (host["NanoCpus"], host["PidsLimit"]) == (500_000_000, 64)
        assert host["SecurityOpt"] == ["no-new-privileges"] and host["Init"] is True
        result = env.execute("pwd; cat /etc/hermes-image; ls /sys/class/net; echo oops >&2; exit 3")
        assert (result.returncode, result.output) == (3, f"/app/work\n{BUSYBOX}\nlo\noops\n")
        assert env.execute("pwd", cwd="sub").output == "cd: sub: No such file or directory\n"
        assert env.execute("mkdir sub && cd sub && pwd").output == "/app/work/sub\n"
        assert env.execute("pwd", cwd="sub").output == "/app/work/sub\n"
        assert env.execute("echo $HOME; pwd", cwd="~").output == "/root\n/root\n"
    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(env.container_id)
    env.close()  # idempotent


def _killed(engine, container_id: str) -> None:
    container = engine.containers.get(container_id)
    container.kill()
    container.wait(timeout=10)


def test_a_container_that_died_is_a_clear_error_naming_its_exit(engine):
    run = f"t-dead-{secrets.token_hex(4)}"
    with DockerEnvironment(image=BUSYBOX, settings=settings(), run_name=run) as env:
        assert env.execute("echo alive").output == "alive\n"
        _killed(engine, env.container_id)
        with pytest.raises(SandboxError, match=r"^the sandbox container exited \(code 137\)$"):
            env.execute("echo again")
    assert labelled(engine, run) == []


def test_an_image_whose_keeper_cannot_start_fails_naming_the_cause(engine, caplog):
    source = engine.containers.run(BUSYBOX, ["rm", "/bin/sleep"], network_mode="none", detach=True)
    source.wait(timeout=30)
    image = source.commit(repository="hermes-test/no-sleep", tag="1")
    source.remove()
    run = f"t-nosleep-{secrets.token_hex(4)}"
    try:
        env = DockerEnvironment(image="hermes-test/no-sleep:1", settings=settings(), run_name=run)
        with pytest.raises(SandboxError) as raised:
            env.start()
        assert re.fullmatch(
            r"the sandbox container exited \(code 127\): \[FATAL tini \(\d+\)\] exec sleep failed: "
            r"No such file or directory \(5 containers tried\)",
            str(raised.value),
        ), raised.value
        replaced = [r.getMessage() for r in caplog.records if "starting a new one" in r.getMessage()]
        assert [m.rsplit("(", 1)[1] for m in replaced] == [f"attempt {n} of 5)" for n in (2, 3, 4, 5)]
        assert labelled(engine, run) == []  # each one removed
        env.close()
    finally:
        engine.images.remove(image.id, force=True)


def test_memory_limit_is_enforced_inside_the_container(engine):
    with DockerEnvironment(image=PYTHON, settings=settings(container_memory_mb=64)) as env:
        limit = env.execute(
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"
        )
        assert limit.output.strip() == str(64 * 2**20)
        hog = env.execute("python3 -c \"b = bytearray(300 * 2**20); print('allocated', len(b))\"")
        assert hog.returncode == 137 and "allocated" not in hog.output  # SIGKILL by the OOM killer
        assert env.execute('python3 -c "print(len(bytearray(16 * 2**20)))"').output == "16777216\n"


def test_pids_limit_is_enforced(engine):
    with DockerEnvironment(image=BUSYBOX, settings=settings(container_pids_limit=16)) as env:
        result = env.execute(
            "i=0; while [ $i -lt 40 ]; do sleep 5 & i=$((i+1)); done; echo launched", timeout=20
        )
        assert "can't fork" in result.output or "Resource temporarily unavailable" in result.output


@pytest.mark.parametrize("image", [BUSYBOX, PYTHON])
def test_timeout_kills_the_whole_command_tree(engine, image):
    with DockerEnvironment(image=image, settings=settings()) as env:
        started = time.monotonic()
        result = env.execute("echo before; sleep 60 & setsid sleep 70 & sleep 50; echo after", timeout=1)
        elapsed = time.monotonic() - started
        assert (result.returncode, result.timed_out, result.output) == (124, True, "before\n")
        assert elapsed < 15  # far below the sleeps; generous for a loaded CI machine
        procs = env.execute("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done").output
        assert "sleep 60" not in procs and "sleep 70" not in procs and "sleep 50" not in procs
        assert "sleep 2147483647" in procs  # the container's own keeper is still there
        quick = env.execute("sleep 5 > /dev/null 2>&1 & echo detached")
        assert (quick.returncode, quick.output) == (0, "detached\n")


def test_output_is_bounded_head_and_tail_with_the_local_marker(engine):
    with DockerEnvironment(image=BUSYBOX, settings=settings(terminal_output_max_chars=1000)) as env:
        result = env.execute("i=0; while [ $i -lt 5000 ]; do echo line$i; i=$((i+1)); done")
    assert result.returncode == 0 and result.truncated
    head, marker, tail = result.output.partition("\n... [OUTPUT TRUNCATED - ")
    total = sum(len(f"line{i}\n") for i in range(5000))
    assert marker and f"chars omitted out of {total} total] ...\n" in tail
    assert head.startswith("line0\nline1\n") and len(head) == 400
    assert tail.endswith("line4998\nline4999\n") and len(tail.split("] ...\n", 1)[1]) == 600


def test_endless_output_is_bounded_and_killed_at_the_timeout(engine):
    with DockerEnvironment(image=BUSYBOX, settings=settings(terminal_output_max_chars=1000)) as env:
        started = time.monotonic()
        flood = env.execute("yes", timeout=2)
        elapsed = time.monotonic() - started
        assert (flood.returncode, flood.timed_out, flood.truncated) == (124, True, True)
        assert flood.output.startswith("y\ny\n") and len(flood.output) < 1100 and 2 <= elapsed < 15
        assert "yes" not in env.execute("ps -o comm").output.split()


@pytest.mark.parametrize("image", [BUSYBOX, PYTHON])
def test_files_round_trip_keep_mode_and_follow_symlinks(engine, image):
    with DockerEnvironment(image=image, cwd="/srv", settings=settings()) as env:
        env.write_file("a/b/data.bin", b"\x00\x01hello\xff")
        assert env.read_file("/srv/a/b/data.bin") == b"\x00\x01hello\xff"
        env.execute("chmod 750 a/b/data.bin && ln -s a/b/data.bin link")
        env.write_file("link", b"#!/bin/sh\necho via-link\n")
        assert env.execute(
            "./a/b/data.bin; stat -c %a a/b/data.bin; [ -L link ] && echo still-a-link"
        ).output == ("via-link\n750\nstill-a-link\n")
        env.write_file("~/notes.txt", b"home")
        assert env.execute("cat /root/notes.txt").output == "home"
        with pytest.raises(FileNotFoundError):
            env.read_file("missing.txt")
        with pytest.raises(IsADirectoryError):
            env.read_file("a")
        with pytest.raises(IsADirectoryError):
            env.write_file("a/b", b"x")


def call(ctx: ToolContext, name: str, **arguments) -> dict:
    return json.loads(REGISTRY[name].invoke(ctx, arguments))


@pytest.mark.parametrize("image", [BUSYBOX, PYTHON])
def test_terminal_and_file_tools_work_unchanged_inside_the_container(engine, image):
    with DockerEnvironment(image=image, cwd="/work", settings=settings()) as env:
        ctx = ToolContext(env=env, settings=settings())
        try:
            assert call(ctx, "write_file", path="pkg/app.py", content="def f():\n    return 1\n") == {
                "bytes_written": 22,
                "dirs_created": True,
            }
            assert (
                call(ctx, "read_file", path="pkg/app.py")["content"] == "     1|def f():\n     2|    return 1"
            )
            patched = call(ctx, "patch", path="pkg/app.py", old_string="return 1", new_string="return 2")
            assert patched["success"] and "+    return 2" in patched["diff"]
            found = call(ctx, "search_files", pattern="return [0-9]", path=".")
            assert found["matches"] == [{"path": "./pkg/app.py", "line": 2, "content": "    return 2"}]
            assert call(ctx, "search_files", pattern="*.py", target="files")["files"] == ["./pkg/app.py"]
            ran = call(ctx, "terminal", command="cat /etc/hermes-image && pwd")
            assert ran == {"output": f"{image}\n/work", "exit_code": 0, "error": None}
            timed = call(ctx, "terminal", command="sleep 30", timeout=1)
            assert timed["exit_code"] == 124 and "timed out after 1s" in timed["output"]
            bg = call(ctx, "terminal", command="echo started; sleep 30", background=True)
            assert bg["exit_code"] == 0 and bg["session_id"].startswith("proc_")
            time.sleep(0.5)
            polled = call(ctx, "process", action="poll", session_id=bg["session_id"])
            assert polled["status"] == "running" and polled["output_preview"] == "started"
            killed = call(ctx, "process", action="kill", session_id=bg["session_id"])
            assert killed["status"] == "killed"
            assert call(ctx, "process", action="poll", session_id=bg["session_id"])["status"] == "exited"
        finally:
            ctx.close()


def test_missing_image_fails_clearly_and_pull_failures_name_the_image(engine):
    env = DockerEnvironment(image=ABSENT, settings=settings(), run_name="t-missing")
    with pytest.raises(ImageUnavailable, match="hermes-test/absent:0.*pulling is off"):
        env.start()
    env.close()
    assert labelled(engine, "t-missing") == []
    problems = check_images([BUSYBOX, ABSENT, BUSYBOX], settings(docker_pull=True, docker_pull_timeout=30))
    assert list(problems) == [ABSENT] and "pull" in problems[ABSENT]


def by_run_id(client: docker.DockerClient, run_id: str) -> list:
    return labelled(client, run_id, LABEL_RUN_ID)


def test_reap_removes_only_the_containers_of_that_run_folder(engine):
    """Two run folders with the same run name: reaping one never touches the other's live containers."""
    mine, other = f"t-reap-{secrets.token_hex(4)}", f"t-reap-{secrets.token_hex(4)}"
    envs = [
        DockerEnvironment(
            image=BUSYBOX, settings=settings(), run_name="same-name", run_id=run_id, prompt_id=i
        )
        for i, run_id in enumerate([mine, mine, mine, other])
    ]
    try:
        for env in envs:
            env.start()
        assert len(by_run_id(engine, mine)) == 3 and len(by_run_id(engine, other)) == 1
        assert len(reap_run_containers(mine)) == 3
        assert by_run_id(engine, mine) == [] and len(by_run_id(engine, other)) == 1
        assert envs[3].execute("echo still-alive").output == "still-alive\n"
        with pytest.raises(ValueError, match="run_id"):
            reap_run_containers("")
    finally:
        for env in envs:
            env.close()  # a container already reaped is fine
    assert by_run_id(engine, other) == []


def test_reap_while_another_process_removes_the_same_containers(engine):
    """A container removed between the engine's listing and its inspection is not an engine failure.

    An earlier invocation still tearing down its containers while the next one starts is how this
    happens in a run; before the fix every trial raised EngineUnavailable ("404 No such container").
    """
    for trial in range(3):
        run_id = f"race-{trial}-{secrets.token_hex(4)}"
        made = [
            engine.containers.create(BUSYBOX, command=["sleep", "60"], labels={LABEL_RUN_ID: run_id})
            for _ in range(30)
        ]

        def remove_them(made=made):
            for container in made:
                try:
                    container.remove(force=True)
                except docker.errors.APIError:  # removed already, or the reaper's removal in progress
                    pass

        remover = threading.Thread(target=remove_them)
        remover.start()
        passes = 0
        while remover.is_alive():
            reap_run_containers(run_id)  # raised EngineUnavailable before
            passes += 1
        remover.join()
        reap_run_containers(run_id)
        assert passes >= 1 and by_run_id(engine, run_id) == []


def test_exec_environment_is_the_image_env_plus_the_listed_names(engine, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-" + secrets.token_hex(8))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-" + secrets.token_hex(8))
    monkeypatch.setenv("FOO_TOKEN", "foo-" + secrets.token_hex(8))
    monkeypatch.setenv("MY_LISTED", "listed-value")
    image_env = {line.split("=", 1)[0] for line in engine.images.get(PYTHON).attrs["Config"]["Env"] or []}
    with DockerEnvironment(image=PYTHON, settings=settings(sandbox_env=["MY_LISTED", "UNSET_NAME"])) as env:
        out = env.execute("env").output
    for name in ("OPENROUTER_API_KEY", "AWS_SECRET_ACCESS_KEY", "FOO_TOKEN"):
        assert os.environ[name] not in out
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    added_by_docker_and_shell = {"HOSTNAME", "HOME", "PWD", "SHLVL", "_", "OLDPWD", "HERMES_EXEC_ID"}
    assert names - image_env - added_by_docker_and_shell == {"MY_LISTED"}
    assert "MY_LISTED=listed-value" in out.splitlines()


def test_close_during_start_leaves_no_container(engine, monkeypatch):
    """A cancel may close the sandbox from another thread while the engine creates its container."""
    from docker.models.containers import ContainerCollection

    run_id = f"t-race-{secrets.token_hex(4)}"
    real_create = ContainerCollection.create
    envs: list[DockerEnvironment] = []

    def create_then_cancel(self, *args, **kwargs):
        container = real_create(self, *args, **kwargs)
        closer = threading.Thread(target=envs[-1].close, kwargs={"interrupted": True})
        closer.start()  # the cancel lands right after the engine made the container
        closer.join()
        return container

    monkeypatch.setattr(ContainerCollection, "create", create_then_cancel)
    envs.append(DockerEnvironment(image=BUSYBOX, settings=settings(), run_id=run_id))
    with pytest.raises(SandboxError, match="closed"):
        envs[-1].start()
    assert by_run_id(engine, run_id) == []
    monkeypatch.setattr(ContainerCollection, "create", real_create)
    for delay in (0.0, 0.05, 0.15, 0.3, 0.6):  # and at whatever point a real cancel lands
        env = DockerEnvironment(image=BUSYBOX, settings=settings(), run_id=run_id)
        starter = threading.Thread(target=lambda env=env: _start_quietly(env))
        starter.start()
        time.sleep(delay)
        env.close(interrupted=True)
        starter.join(timeout=60)
        assert by_run_id(engine, run_id) == [], f"leak with close after {delay}s"
        with pytest.raises(SandboxError, match="closed"):
            env.start()


def _start_quietly(env: DockerEnvironment) -> None:
    try:
        env.start()
    except SandboxError:
        pass


def test_container_starts_are_bounded_without_deadlock(engine, monkeypatch):
    from docker.models.containers import ContainerCollection

    real_create = ContainerCollection.create
    lock, in_flight, peak = threading.Lock(), [0], [0]

    def counting_create(self, *args, **kwargs):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            time.sleep(0.2)  # widen the window so unbounded starts would overlap
            return real_create(self, *args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(ContainerCollection, "create", counting_create)
    s = settings(docker_max_concurrent_starts=2)
    outputs: list[str] = []

    def prompt(i: int) -> None:
        with DockerEnvironment(image=BUSYBOX, settings=s, run_name="t-bound", prompt_id=i) as env:
            outputs.append(env.execute(f"echo {i}").output)

    threads = [threading.Thread(target=prompt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(outputs, key=int) == [f"{i}\n" for i in range(8)]
    assert peak[0] == 2
    assert labelled(engine, "t-bound") == []


def test_unreachable_engine_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/hermes-docker.sock")
    with pytest.raises(EngineUnavailable, match="not reachable at unix:///nonexistent/hermes-docker.sock"):
        docker_client()
    with pytest.raises(EngineUnavailable):
        DockerEnvironment(image=BUSYBOX).start()
    with pytest.raises(EngineUnavailable):
        check_images([BUSYBOX])
