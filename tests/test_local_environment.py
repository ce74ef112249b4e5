"""LocalEnvironment: isolation, paths, timeouts that kill process trees, bounded output, teardown."""

from __future__ import annotations

import os
import time

import pytest

from hermes_core.environments import Environment, ExecResult, create_environment
from hermes_core.environments.local import LocalEnvironment
from hermes_core.exceptions import SandboxError
from hermes_core.settings import HermesSettings
from tests.conftest import process_alive, wait_dead


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


def test_exit_code_and_merged_output():
    with LocalEnvironment() as env:
        result = env.execute("echo out; echo err >&2; exit 3")
    assert result == ExecResult(returncode=3, output="out\nerr\n", truncated=False, timed_out=False)


def test_invalid_utf8_is_replaced():
    with LocalEnvironment() as env:
        assert env.execute(r"printf 'a\377b'").output == "a\ufffdb"


def test_two_environments_are_isolated():
    with LocalEnvironment() as one, LocalEnvironment() as two:
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


def test_relative_absolute_and_home_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with LocalEnvironment() as env:
        env.write_file("sub/dir/f.txt", b"data")  # parents created
        assert env.read_file(os.path.join(env.cwd, "sub/dir/f.txt")) == b"data"
        assert env.execute("cat f.txt", cwd="sub/dir").output == "data"
        assert env.execute("pwd", cwd="sub").output.strip() == os.path.join(env.cwd, "sub")
        missing = env.execute("pwd", cwd="nope")
        assert missing.returncode == 1 and "nope" in missing.output
        env.write_file("~/home.txt", b"at home")
        assert (tmp_path / "home.txt").read_bytes() == b"at home"
        assert env.read_file("~/home.txt") == b"at home"
        with pytest.raises(IsADirectoryError):
            env.read_file("sub")


def test_timeout_kills_the_process_tree_and_keeps_partial_output():
    with LocalEnvironment() as env:
        start = time.monotonic()
        result = env.execute("echo partial; sh -c 'echo $$ > gc.pid; exec sleep 30' & sleep 30", timeout=1)
        elapsed = time.monotonic() - start
        assert result.returncode == 124 and result.timed_out
        assert result.output == "partial\n"
        assert elapsed < 4
        grandchild = _read_pid(env, "gc.pid")
        assert wait_dead(grandchild)


def test_default_timeout_comes_from_settings():
    with LocalEnvironment(settings=HermesSettings(terminal_timeout=1)) as env:
        start = time.monotonic()
        assert env.execute("sleep 20").returncode == 124
        assert time.monotonic() - start < 4


def test_background_child_does_not_block_the_command():
    with LocalEnvironment() as env:
        start = time.monotonic()
        result = env.execute("sleep 20 & echo started")
        assert result == ExecResult(returncode=0, output="started\n")
        assert time.monotonic() - start < 3


def test_output_is_bounded_head_and_tail():
    settings = HermesSettings(terminal_output_max_chars=10_000)
    full = "".join(f"{i}\n" for i in range(1, 200_001))
    with LocalEnvironment(settings=settings) as env:
        result = env.execute("seq 1 200000")
    omitted = len(full) - 10_000
    marker = f"\n... [OUTPUT TRUNCATED - {omitted} chars omitted out of {len(full)} total] ...\n"
    assert result.truncated and result.returncode == 0
    assert result.output == full[:4000] + marker + full[-6000:]


def test_one_megabyte_is_cut_to_the_bound():
    with LocalEnvironment(settings=HermesSettings(terminal_output_max_chars=50_000)) as env:
        result = env.execute("head -c 1000000 /dev/zero | tr '\\0' a")
    assert result.truncated
    assert "[OUTPUT TRUNCATED - 950000 chars omitted out of 1000000 total]" in result.output
    assert result.output.startswith("a" * 20_000 + "\n...") and result.output.endswith("\n" + "a" * 30_000)


def test_teardown_on_error_removes_tempdir_and_kills_processes():
    with pytest.raises(RuntimeError, match="boom"):
        with LocalEnvironment() as env:
            cwd = env.cwd
            env.execute("sleep 30 >/dev/null 2>&1 & echo $! > bg.pid")
            pid = _read_pid(env, "bg.pid")
            assert process_alive(pid)
            raise RuntimeError("boom")
    assert not os.path.exists(cwd)
    assert wait_dead(pid)


def test_given_cwd_is_created_and_kept(tmp_path):
    target = tmp_path / "work" / "deep"
    env = LocalEnvironment(cwd=str(target))
    with env:
        assert env.cwd == str(target)
        env.write_file("kept.txt", b"x")
        assert env.execute("pwd").output.strip() == str(target)
    assert (target / "kept.txt").read_bytes() == b"x"


def test_close_is_idempotent_and_ends_the_environment():
    env = LocalEnvironment()
    with pytest.raises(SandboxError):
        env.execute("true")
    env.start()
    cwd = env.cwd
    env.close()
    env.close(interrupted=True)
    assert not os.path.exists(cwd)
    with pytest.raises(SandboxError):
        env.execute("true")
