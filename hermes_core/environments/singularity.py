"""Backend ``singularity``: one Apptainer/Singularity instance per prompt, through the command line.

``start`` runs ``apptainer instance start`` (or ``singularity``, whichever is on PATH) on
``docker://IMAGE`` with ``--containall``, no network (``--net --network none``) unless
``settings.container_network``, the container limits of the settings, and a fresh host folder
bound at the working directory. Each command is ``apptainer exec instance://NAME sh -c ...``
run by a host :class:`~hermes_core.environments.local.LocalEnvironment`, so timeouts kill the
whole process tree and output is bounded exactly as in the local backend. Files go through
``exec`` (``cat`` out, ``cat >`` from stdin). ``close`` runs ``apptainer instance stop``.
Every ``exec`` has ``--cleanenv`` and, when ``HERMES_SANDBOX_ENV`` lists names, ``--env-file``
of a private host file (mode 0600, outside the bound folder, removed at ``close``) holding
them: the container sees its image's environment and those only, and the values are not on
the host's command lines. (The
``apptainer`` binary itself runs with this process's environment: its cache and config
variables.)

Not verified against a real Apptainer here (none is installed): the tests drive a stand-in
``apptainer`` executable that records its arguments and runs the commands on the host.
Command-line flags follow the Apptainer 1.x user guide (``instance start``, ``exec``,
``--containall``, ``--writable-tmpfs``, ``--bind``, ``--net --network``, ``--memory``,
``--cpus``, ``--pids-limit``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import secrets
import shlex
import shutil
import subprocess

from hermes_core.environments import ContainerSandbox, ExecResult
from hermes_core.environments._scripts import RUN_SH, ScriptedFiles, file_argv
from hermes_core.environments.local import LocalEnvironment
from hermes_core.environments.sandbox_env import listed_environment
from hermes_core.environments.scratch import make_temp_file
from hermes_core.exceptions import SandboxError

logger = logging.getLogger(__name__)


def find_binary() -> str | None:
    """Path of ``apptainer``, else ``singularity``, on PATH; None when neither is installed."""
    return shutil.which("apptainer") or shutil.which("singularity")


def image_uri(image: str) -> str:
    """The URI Apptainer should run: ``docker://IMAGE`` unless ``image`` already names a scheme or a ``.sif`` file."""
    if "://" in image or image.endswith(".sif"):
        return image
    return f"docker://{image}"


class SingularityEnvironment(ScriptedFiles, ContainerSandbox):
    """Per-prompt sandbox in an Apptainer/Singularity instance.

    Args:
        cwd: working directory inside the instance (a fresh host folder is bound there);
            relative paths are taken under ``/workspace``. None: ``/workspace``.
        image: image (``docker://`` added when no scheme is given); None: ``settings.terminal_docker_image``.
        settings: limits, network, timeouts and the output bound; default ``HermesSettings()``.
        run_name, run_id, prompt_id: only in logs (the instance is named ``hermes-<12 hex>``).
        **_ignored: options of other backends, accepted and ignored.

    Attributes:
        cwd: absolute working directory inside the instance.
        instance: instance name ("" until :meth:`start`).
    """

    def __init__(self, cwd: str | None = None, image: str | None = None, **kwargs: object):
        super().__init__(cwd, image, **kwargs)
        self.image = image_uri(self.image)
        self.instance = ""
        self._env_file = ""
        self._binary = find_binary()
        self._host = LocalEnvironment(settings=self.settings, environment=dict(os.environ))

    def start(self) -> None:
        """Start the instance. Idempotent.

        Safe against :meth:`close` called from another thread meanwhile: an instance started
        after (or while) close ran is stopped at once and SandboxError is raised.

        Raises:
            SandboxError: no apptainer/singularity binary, the instance did not start
                (the message has the tool's output), or the environment was closed.
        """
        if self._closed:
            raise SandboxError("environment already closed")
        if self.instance:
            return
        if not self._binary:
            raise SandboxError("terminal backend singularity needs `apptainer` or `singularity` on PATH")
        self._host.start()
        self._write_env_file()
        name = f"hermes-{secrets.token_hex(6)}"
        s = self.settings
        argv = [self._binary, "instance", "start", "--containall", "--writable-tmpfs"]
        argv += ["--bind", f"{self._host.cwd}:{self.cwd}"]
        if not s.container_network:
            argv += ["--net", "--network", "none"]
        argv += ["--memory", f"{s.container_memory_mb}M", "--cpus", f"{s.container_cpus:g}"]
        argv += ["--pids-limit", str(s.container_pids_limit), self.image, name]
        try:
            result = self._host.execute(shlex.join(argv), timeout=s.docker_pull_timeout)
        except SandboxError:
            result = None  # close() ended the host runner meanwhile
        with self._state_lock:
            closed = self._closed
            if not closed and result is not None and result.returncode == 0:
                self.instance = name
        if closed:  # the instance may exist although its start was cut short
            self._stop(name)
            self._remove_env_file()
            raise SandboxError("environment closed while it started")
        if not self.instance:
            self.close()  # the host folder and the env file go too
            output = result.output.strip()[-500:] if result else ""
            raise SandboxError(f"apptainer instance start failed for {self.image}: {output}")
        logger.debug("instance %s of run %s prompt %s started", name, self.run_name, self.prompt_id)

    def close(self, interrupted: bool = False) -> None:
        """Stop the instance (every process in it ends) and remove the bound host folder.

        Idempotent; never raises; safe from another thread while :meth:`start` runs.
        """
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            instance = self.instance
        if instance:
            self._stop(instance)
        self._host.close()
        self._remove_env_file()

    def _remove_env_file(self) -> None:
        if self._env_file:
            with contextlib.suppress(OSError):
                os.unlink(self._env_file)

    def _write_env_file(self) -> None:
        """Write the listed variables (``export NAME='value'`` lines) to a private file for ``--env-file``."""
        listed = listed_environment(self.settings)
        if not listed:
            return
        fd, self._env_file = make_temp_file("hermes-env-")  # mode 0600
        with os.fdopen(fd, "w") as fh:
            fh.writelines(f"export {name}={shlex.quote(value)}\n" for name, value in listed.items())

    def _stop(self, name: str) -> None:
        """``apptainer instance stop NAME`` (a missing instance is fine). Never raises."""
        try:
            subprocess.run(
                [self._binary, "instance", "stop", name], capture_output=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.warning("could not stop instance %s: %s", name, exc)

    def _exec_argv(self, *args: str) -> list[str]:
        if not self.instance or self._closed:
            raise SandboxError("environment is not running (call start() first; close() ends it)")
        env = ["--env-file", self._env_file] if self._env_file else []
        return [self._binary, "exec", "--cleanenv", *env, f"instance://{self.instance}", *args]

    def execute(self, command: str, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        """Run ``command`` with bash (else sh) ``-c`` in the instance, in ``cwd`` (default the environment's cwd).

        Timeout (seconds, default ``settings.terminal_timeout``) and output bound as
        :meth:`LocalEnvironment.execute <hermes_core.environments.local.LocalEnvironment.execute>`:
        returncode 124 and ``timed_out=True`` on timeout.

        Raises:
            SandboxError: not started or closed.
        """
        workdir = posixpath.join(self.cwd, cwd) if cwd and not cwd.startswith("~") else (cwd or self.cwd)
        argv = self._exec_argv("sh", "-c", RUN_SH, "hermes", workdir, cwd or self.cwd, command)
        return self._host.execute(shlex.join(argv), timeout=timeout)

    def _file_script(self, script: str, path: str, data: bytes | None = None) -> tuple[int, bytes, bytes]:
        """A file script (:class:`~hermes_core.environments._scripts.ScriptedFiles`) in the instance."""
        argv = self._exec_argv(*file_argv(script, self.cwd, path))
        try:
            done = subprocess.run(
                argv, input=data or b"", capture_output=True, timeout=self.settings.terminal_timeout
            )
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"file operation timed out after {self.settings.terminal_timeout}s") from None
        except OSError as exc:
            raise SandboxError(f"cannot run {self._binary}: {exc}") from None
        return done.returncode, done.stdout, done.stderr


__all__ = ["SingularityEnvironment", "find_binary", "image_uri"]
