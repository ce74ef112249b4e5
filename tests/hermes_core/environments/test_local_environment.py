"""LocalEnvironment: isolation, paths, timeouts that kill process trees, bounded output, teardown.

Every test runs twice: plain subprocesses (``none``) and the per-prompt bubblewrap sandbox
(``bwrap``; skipped without bwrap outside CI). Process checks go through the environment
(``kill -0`` sees the sandbox's own pid namespace) or scan the host's /proc for a marker.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from hermes_core.environments import Environment, ExecResult, create_environment
from hermes_core.environments.local import LocalEnvironment
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings
from tests.conftest import host_pids_with


@pytest.fixture(params=["none", "bwrap"])
def mode(request) -> str:
    if request.param == "bwrap" and not shutil.which("bwrap") and os.environ.get("CI", "").lower() != "true":
        pytest.skip("bubblewrap (bwrap) is not installed")
    return request.param


def local(mode: str, cwd: str | None = None, **values) -> LocalEnvironment:
    return LocalEnvironment(cwd=cwd, settings=HermesSettings(local_isolation=mode, **values))


def alive_in(env: LocalEnvironment, pid: int, seconds: float = 3.0) -> bool:
    """True while ``pid`` (as the environment numbers it) is alive after up to ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        alive = env.execute(f"kill -0 {pid} 2>/dev/null && echo alive").output == "alive\n"
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


def _read_pid(env: LocalEnvironment, name: str, seconds: float = 3.0) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            text = env.read_file(name).decode().strip()
        except FileNotFoundError:
            text = ""
        if text.isdigit():
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"{name} was never written")


def test_create_environment_ignores_backend_neutral_options():
    env = create_environment("local", image="python:3.11", run_name="r", prompt_id=7)
    assert isinstance(env, LocalEnvironment)
    assert isinstance(env, Environment)
    with env:
        assert env.execute("echo hi") == ExecResult(returncode=0, output="hi\n")


def test_exit_code_and_merged_output(mode):
    with local(mode) as env:
        result = env.execute("echo out; echo err >&2; exit 3")
    assert result == ExecResult(returncode=3, output="out\nerr\n", truncated=False, timed_out=False)


def test_invalid_utf8_is_replaced(mode):
    with local(mode) as env:
        assert env.execute(r"printf 'a\377b'").output == "a\ufffdb"


def test_two_environments_are_isolated(mode):
    with local(mode) as one, local(mode) as two:
        assert one.cwd != two.cwd
        assert os.path.basename(one.cwd).startswith("hermes-")
        one.write_file("secret.txt", b"only in one")
        assert one.execute("cat secret.txt").output == "only in one"
        assert two.execute("ls -A").output == ""
        assert two.execute("cat secret.txt").returncode != 0
        with pytest.raises(FileNotFoundError):
            two.read_file("secret.txt")
        assert one.execute("pwd").output.strip() == one.cwd
        assert two.execute("pwd").output.strip() == two.cwd


def test_relative_absolute_and_home_paths(mode):
    with local(mode) as env:
        env.write_file("sub/dir/f.txt", b"data")  # parents created
        assert env.read_file(os.path.join(env.cwd, "sub/dir/f.txt")) == b"data"
        assert env.execute("cat f.txt", cwd="sub/dir").output == "data"
        assert env.execute("pwd", cwd="sub").output.strip() == os.path.join(env.cwd, "sub")
        missing = env.execute("pwd", cwd="nope")
        assert missing.returncode == 1 and "nope" in missing.output
        env.write_file("~/home.txt", b"at home")  # HOME is the prompt's folder, for commands and files
        assert env.execute("echo $HOME; cat ~/home.txt").output == f"{env.cwd}\nat home"
        assert env.read_file(os.path.join(env.cwd, "home.txt")) == b"at home"
        assert env.read_file("~/home.txt") == b"at home"
        with pytest.raises(IsADirectoryError):
            env.read_file("sub")


def test_timeout_kills_the_process_tree_and_keeps_partial_output(mode):
    with local(mode) as env:
        start = time.monotonic()
        result = env.execute("echo partial; sh -c 'echo $$ > gc.pid; exec sleep 30' & sleep 30", timeout=1)
        elapsed = time.monotonic() - start
        assert result.returncode == 124 and result.timed_out
        assert result.output == "partial\n"
        assert elapsed < 4
        grandchild = _read_pid(env, "gc.pid")
        assert not alive_in(env, grandchild)


def test_default_timeout_comes_from_settings(mode):
    with local(mode, terminal_timeout=1) as env:
        start = time.monotonic()
        assert env.execute("sleep 20").returncode == 124
        assert time.monotonic() - start < 4


def test_background_child_does_not_block_the_command(mode):
    with local(mode) as env:
        start = time.monotonic()
        result = env.execute("sleep 20 & echo started")
        assert result == ExecResult(returncode=0, output="started\n")
        assert time.monotonic() - start < 3


def test_output_is_bounded_head_and_tail(mode):
    full = "".join(f"{i}\n" for i in range(1, 200_001))
    with local(mode, terminal_output_max_chars=10_000) as env:
        result = env.execute("seq 1 200000")
    omitted = len(full) - 10_000
    marker = f"\n... [OUTPUT TRUNCATED - {omitted} chars omitted out of {len(full)} total] ...\n"
    assert result.truncated and result.returncode == 0
    assert result.output == full[:4000] + marker + full[-6000:]


def test_one_megabyte_is_cut_to_the_bound(mode):
    with local(mode, terminal_output_max_chars=50_000) as env:
        result = env.execute("head -c 1000000 /dev/zero | tr '\\0' a")
    assert result.truncated
    assert "[OUTPUT TRUNCATED - 950000 chars omitted out of 1000000 total]" in result.output
    assert result.output.startswith("a" * 20_000 + "\n...") and result.output.endswith("\n" + "a" * 30_000)


def test_teardown_on_error_removes_tempdir_and_kills_processes(mode):
    marker = f"3{os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"  # a unique `sleep` argument
    with pytest.raises(RuntimeError, match="boom"):
        with local(mode) as env:
            cwd = env.cwd
            env.execute(f"sleep {marker} >/dev/null 2>&1 & echo $! > bg.pid")
            pid = _read_pid(env, "bg.pid")
            assert alive_in(env, pid, seconds=0)
            started = time.monotonic() + 5  # the background shell execs sleep a moment after $! exists
            while not host_pids_with(f"sleep\0{marker}") and time.monotonic() < started:
                time.sleep(0.02)
            assert host_pids_with(f"sleep\0{marker}")
            raise RuntimeError("boom")
    assert not os.path.exists(cwd)
    end = time.monotonic() + 3
    while host_pids_with(f"sleep\0{marker}") and time.monotonic() < end:
        time.sleep(0.05)
    assert host_pids_with(f"sleep\0{marker}") == []


def test_a_relative_cwd_is_a_folder_inside_the_prompt_folder(mode, tmp_path):
    env = local(mode, cwd="work/deep")
    with env:
        assert env.cwd == os.path.join(env.home, "work", "deep")
        env.write_file("kept.txt", b"x")
        assert env.execute("pwd").output.strip() == env.cwd
        assert env.read_file(os.path.join(env.home, "work/deep/kept.txt")) == b"x"
    assert not os.path.exists(env.home)  # the prompt's folder goes, cwd and all


def test_close_is_idempotent_and_ends_the_environment(mode):
    env = local(mode)
    with pytest.raises(SandboxError):
        env.execute("true")
    env.start()
    cwd = env.cwd
    env.close()
    env.close(interrupted=True)
    assert not os.path.exists(cwd)
    with pytest.raises(SandboxError):
        env.execute("true")
    with pytest.raises(SandboxError, match="closed"):
        env.start()


def test_waiting_on_a_descriptor_above_1024_works():
    """A flow with hundreds of prompts in flight has descriptors >= 1,024: select.select fails there."""
    import os
    import socket

    from hermes_core.environments.poll import readable

    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    a, b = socket.socketpair()
    try:
        assert a.fileno() >= 1024
        assert not readable(a, 0.01)
        b.send(b"x")
        assert readable(a, 0.01)
    finally:
        for fd in filler:
            os.close(fd)
        a.close()
        b.close()
