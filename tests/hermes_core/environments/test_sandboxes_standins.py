"""The singularity and modal backends against stand-ins at their boundaries (neither service is reachable here).

* singularity: a fake ``apptainer`` executable on PATH records its argv and runs ``exec``
  commands on the host (container paths under the bound folder are mapped to it).
* modal: a fake ``modal`` module (App.lookup, Image.from_registry, Sandbox.create/exec/terminate,
  ContainerProcess stdout/stderr/stdin/wait/returncode) that runs commands as host processes
  and kills them at the exec timeout. Its signatures are explicit: an unexpected argument is a TypeError.

These prove our side of the boundary (arguments, timeouts, bounded output, files, teardown),
not the behaviour of the real Apptainer or Modal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import pytest

from hermes_core.environments import create_environment
from hermes_core.environments.singularity import SingularityEnvironment, image_uri
from hermes_core.exceptions import ConfigError, SandboxError
from hermes_core.settings import HermesSettings

FAKE_APPTAINER = r'''#!/usr/bin/env python3
"""Stand-in for apptainer: logs argv, keeps instance binds in a state folder, runs exec on the host."""
import json, os, shlex, sys
state = os.environ["FAKE_APPTAINER_STATE"]
args = sys.argv[1:]
with open(os.path.join(state, "log.jsonl"), "a") as log:
    log.write(json.dumps(args) + "\n")
if args[:2] == ["instance", "start"]:
    name, binds = args[-1], dict(a.split(":", 1)[::-1] for a in args[2:-2] if ":" in a and a.startswith("/"))
    json.dump(binds, open(os.path.join(state, name + ".json"), "w"))
    sys.exit(0)
if args[:2] == ["instance", "stop"]:
    os.remove(os.path.join(state, args[2] + ".json"))
    sys.exit(0)
if args[0] == "exec":
    env = dict(os.environ)
    args = args[1:]
    while args[0].startswith("--"):  # --cleanenv: only the image's PATH and the --env-file lines
        flag, args = args[0], args[1:]
        if flag == "--cleanenv":
            env = {"PATH": "/usr/bin:/bin"}
        elif flag == "--env-file":
            for line in open(args[0]):
                name, _, value = line.removeprefix("export ").strip().partition("=")
                env[name] = shlex.split(value)[0]
            args = args[1:]
        else:
            sys.exit("fake apptainer: unsupported exec flag %r" % flag)
    args = ["exec", *args]
if args[0] == "exec" and args[1].startswith("instance://"):
    binds = json.load(open(os.path.join(state, args[1][len("instance://"):] + ".json")))
    def host(arg):
        for dst, src in binds.items():
            if arg == dst or arg.startswith(dst + "/"):
                return src + arg[len(dst):]
        return arg
    cmd = [host(a) for a in args[2:]]
    os.execvpe(cmd[0], cmd, env)
sys.exit("fake apptainer: unsupported arguments %r" % (args,))
'''


@pytest.fixture
def apptainer(tmp_path, monkeypatch) -> Path:
    """Put the fake ``apptainer`` first on PATH; yields its state folder (``log.jsonl`` = one argv per call)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text(FAKE_APPTAINER.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APPTAINER_STATE", str(state))
    return state


def calls(state: Path) -> list[list[str]]:
    return [json.loads(line) for line in (state / "log.jsonl").read_text().splitlines()]


def test_image_uri():
    assert image_uri("python:3.11-slim") == "docker://python:3.11-slim"
    assert image_uri("library://alpine") == "library://alpine"
    assert image_uri("/images/tool.sif") == "/images/tool.sif"


def test_singularity_instance_lifecycle_commands_files_and_limits(apptainer):
    s = HermesSettings(
        container_memory_mb=512, container_cpus=1.5, container_pids_limit=99, terminal_output_max_chars=1000
    )
    env = create_environment("singularity", image="python:3.11-slim", cwd="/app", settings=s)
    assert isinstance(env, SingularityEnvironment)
    with env:
        start = calls(apptainer)[0]
        host_dir = start[start.index("--bind") + 1].split(":")[0]
        assert start == [
            "instance", "start", "--containall", "--writable-tmpfs", "--bind", f"{host_dir}:/app",
            "--net", "--network", "none", "--memory", "512M", "--cpus", "1.5", "--pids-limit", "99",
            "docker://python:3.11-slim", env.instance,
        ]  # fmt: skip
        result = env.execute("echo out; echo err >&2; exit 4")
        assert (result.returncode, result.output) == (4, "out\nerr\n")
        assert calls(apptainer)[-1][:5] == ["exec", "--cleanenv", f"instance://{env.instance}", "sh", "-c"]
        env.write_file("pkg/data.bin", b"\x00bytes\xff")
        assert (Path(host_dir) / "pkg" / "data.bin").read_bytes() == b"\x00bytes\xff"
        assert env.read_file("pkg/data.bin") == b"\x00bytes\xff"
        assert env.execute("cat data.bin", cwd="pkg").output == "\x00bytes\ufffd"
        with pytest.raises(FileNotFoundError):
            env.read_file("missing")
        with pytest.raises(IsADirectoryError):
            env.read_file("pkg")
        started = time.monotonic()
        timed = env.execute("echo first; sleep 30", timeout=1)
        assert (timed.returncode, timed.timed_out, timed.output) == (124, True, "first\n")
        assert time.monotonic() - started < 4
        big = env.execute("seq 1 5000")
        assert big.truncated and big.output.startswith("1\n2\n") and big.output.endswith("4999\n5000\n")
    assert calls(apptainer)[-1] == ["instance", "stop", env.instance]
    assert not os.path.exists(host_dir)


def test_singularity_commands_get_a_clean_environment_plus_the_listed_names(apptainer, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-host-secret-1234")
    monkeypatch.setenv("MY_LISTED", "it's, listed")
    with SingularityEnvironment(image="alpine", settings=HermesSettings(sandbox_env=["MY_LISTED"])) as env:
        out = env.execute("env").output
        assert "sk-host-secret-1234" not in out and "MY_LISTED=it's, listed" in out.splitlines()
        env_file = calls(apptainer)[-1][calls(apptainer)[-1].index("--env-file") + 1]
        assert "MY_LISTED" in Path(env_file).read_text() and oct(os.stat(env_file).st_mode)[-3:] == "600"
        assert all("it's" not in arg for arg in calls(apptainer)[-1])  # the value is not on a command line
    assert not os.path.exists(env_file)


def test_singularity_close_during_start_stops_the_instance(apptainer, monkeypatch):
    """A cancel may close the environment from another thread while ``instance start`` runs."""
    slow = apptainer.parent / "bin" / "apptainer"
    slow.write_text(
        slow.read_text().replace(
            'if args[:2] == ["instance", "start"]:',
            'if args[:2] == ["instance", "start"]:\n    import time; time.sleep(1)',
            1,
        )
    )
    env = SingularityEnvironment(image="alpine")
    errors: list[BaseException] = []
    starter = threading.Thread(target=lambda: _catch(env.start, errors))
    starter.start()
    time.sleep(0.5)
    env.close(interrupted=True)
    starter.join(timeout=30)
    assert len(errors) == 1 and "closed" in str(errors[0])
    started = [c for c in calls(apptainer) if c[:2] == ["instance", "start"]]
    stopped = [c for c in calls(apptainer) if c[:2] == ["instance", "stop"]]
    assert len(started) == 1 and stopped == [["instance", "stop", started[0][-1]]]
    with pytest.raises(SandboxError, match="closed"):
        env.start()


def _catch(fn, errors: list) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        errors.append(exc)


def test_singularity_network_setting_and_missing_binary(apptainer, monkeypatch):
    with SingularityEnvironment(
        image="docker://alpine", settings=HermesSettings(container_network=True)
    ) as env:
        assert "--net" not in calls(apptainer)[0] and calls(apptainer)[0][-2] == "docker://alpine"
        assert env.execute("echo ok").output == "ok\n"
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError, match="apptainer"):
        SingularityEnvironment(image="alpine").start()


# -- modal ------------------------------------------------------------------------------


class _Reader:
    def __init__(self, pipe):
        self._pipe = pipe

    def __iter__(self):
        while chunk := self._pipe.read1(65536):
            yield chunk

    def read(self) -> bytes:
        return self._pipe.read()


class _Writer:
    def __init__(self, pipe):
        self._pipe, self._buffer = pipe, b""

    def write(self, data: bytes) -> None:
        self._buffer += data

    def write_eof(self) -> None:
        self._eof = True

    def drain(self) -> None:
        self._pipe.write(self._buffer)
        if getattr(self, "_eof", False):
            self._pipe.close()


class FakeProcess:
    """ContainerProcess stand-in: a host process group killed at the exec timeout (as Modal does)."""

    def __init__(self, argv: list[str], timeout: int | None, env: dict):
        self._proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.stdout, self.stderr, self.stdin = (
            _Reader(self._proc.stdout),
            _Reader(self._proc.stderr),
            _Writer(self._proc.stdin),
        )
        if timeout:
            self._timer = threading.Timer(timeout, self._kill)
            self._timer.start()

    def _kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        code = self._proc.wait()
        if getattr(self, "_timer", None):
            self._timer.cancel()
        return code

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode


class FakeSandbox:
    """modal.Sandbox stand-in: its filesystem is a host temp folder (``root``), gone when terminated."""

    def __init__(self, root: str, record: dict, env: dict):
        self.root, self.record, self.terminated, self.env = root, record, False, env
        record["sandbox"] = self

    def exec(self, *argv: str, timeout: int | None = None, text: bool = True) -> FakeProcess:
        assert not self.terminated and text is False
        self.record.setdefault("execs", []).append((argv, timeout))
        host = [
            self.root + a if a.startswith("/workspace") else a for a in argv
        ]  # the sandbox's / is the root dir
        return FakeProcess(host, timeout, self.env)

    def terminate(self) -> None:
        self.terminated = True
        self.record["terminated"] = True
        shutil.rmtree(self.root, ignore_errors=True)


def make_fake_modal(record: dict) -> types.ModuleType:
    modal = types.ModuleType("modal")

    class App:
        @staticmethod
        def lookup(name: str, *, create_if_missing: bool = False):
            record["app"] = (name, create_if_missing)
            return ("app", name)

    class Image:
        @staticmethod
        def from_registry(tag: str):
            record["image"] = tag
            return ("image", tag)

    class Sandbox:
        @staticmethod
        def create(
            *args, app, image, timeout: int, cpu: float, memory: int, block_network: bool, secrets: list = ()
        ):
            record["create"] = {
                "args": args, "app": app, "image": image, "timeout": timeout,
                "cpu": cpu, "memory": memory, "block_network": block_network,
            }  # fmt: skip
            if secrets:
                record["secrets"] = secrets
            env = {"PATH": "/usr/bin:/bin"}  # the image's environment, then the secrets'
            for secret in secrets:
                env.update(secret[1])
            return FakeSandbox(tempfile.mkdtemp(prefix="fake-modal-"), record, env)

    class Secret:
        @staticmethod
        def from_dict(env_dict: dict):
            return ("secret", dict(env_dict))

    modal.App, modal.Image, modal.Sandbox, modal.Secret = App, Image, Sandbox, Secret
    return modal


def test_modal_sandbox_lifecycle_commands_files_and_limits(monkeypatch):
    record: dict = {}
    monkeypatch.setitem(sys.modules, "modal", make_fake_modal(record))
    s = HermesSettings(container_memory_mb=2048, container_cpus=2, terminal_output_max_chars=1000)
    env = create_environment("modal", image="python:3.11-slim", cwd="/workspace/proj", settings=s)
    with env:
        assert record["app"] == ("hermes-batch", True) and record["image"] == "python:3.11-slim"
        assert record["create"] == {
            "args": ("sleep", "infinity"), "app": ("app", "hermes-batch"), "image": ("image", "python:3.11-slim"),
            "timeout": 86400, "cpu": 2.0, "memory": 2048, "block_network": True,
        }  # fmt: skip
        root = record["sandbox"].root
        assert os.path.isdir(f"{root}/workspace/proj")  # created by start()
        result = env.execute("echo out; echo err >&2; exit 5")
        assert (result.returncode, result.output) == (5, "out\nerr\n")
        assert record["execs"][-1][1] == 180  # the default terminal timeout, passed to Modal
        env.write_file("/workspace/proj/a/b.txt", b"hello \x00")
        assert Path(f"{root}/workspace/proj/a/b.txt").read_bytes() == b"hello \x00"
        assert env.read_file("/workspace/proj/a/b.txt") == b"hello \x00"
        with pytest.raises(FileNotFoundError):
            env.read_file("/workspace/proj/none")
        timed = env.execute("echo first; sleep 30", timeout=1)
        assert (timed.returncode, timed.timed_out, timed.output) == (124, True, "first\n")
        big = env.execute("seq 1 5000")
        assert big.truncated and "[OUTPUT TRUNCATED - " in big.output and big.output.endswith("5000\n")
    assert record["terminated"] is True and not os.path.exists(root)
    with pytest.raises(SandboxError, match="not running"):
        env.execute("true")


def test_modal_sandbox_gets_only_the_listed_names(monkeypatch):
    record: dict = {}
    monkeypatch.setitem(sys.modules, "modal", make_fake_modal(record))
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-host-secret-1234")
    monkeypatch.setenv("MY_LISTED", "listed-value")
    with create_environment(
        "modal", image="alpine", settings=HermesSettings(sandbox_env=["MY_LISTED"])
    ) as env:
        out = env.execute("env").output
    assert record["secrets"] == [("secret", {"MY_LISTED": "listed-value"})]
    assert "MY_LISTED=listed-value" in out.splitlines() and "sk-host-secret-1234" not in out
    record.clear()
    with create_environment("modal", image="alpine", settings=HermesSettings(sandbox_env=[])):
        assert "secrets" not in record


def test_modal_close_during_create_terminates_the_sandbox(monkeypatch):
    record: dict = {}
    modal = make_fake_modal(record)
    real_create = modal.Sandbox.create
    env = create_environment("modal", image="alpine")

    def create_while_closed(*args, **kwargs):
        env.close(interrupted=True)  # the cancel lands while Modal builds the sandbox
        return real_create(*args, **kwargs)

    modal.Sandbox.create = staticmethod(create_while_closed)
    monkeypatch.setitem(sys.modules, "modal", modal)
    with pytest.raises(SandboxError, match="closed"):
        env.start()
    assert record["terminated"] is True


def test_modal_network_setting_and_missing_sdk(monkeypatch):
    record: dict = {}
    monkeypatch.setitem(sys.modules, "modal", make_fake_modal(record))
    with create_environment("modal", image="alpine", settings=HermesSettings(container_network=True)):
        assert record["create"]["block_network"] is False
    monkeypatch.setitem(sys.modules, "modal", None)  # import modal -> ImportError
    with pytest.raises(ConfigError, match="pip install modal"):
        create_environment("modal", image="alpine").start()
