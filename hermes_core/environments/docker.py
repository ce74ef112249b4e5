"""Backend ``docker``: one container per prompt, driven through the Docker Engine API (PyPI ``docker``).

The container runs ``sleep`` under Docker's init (``init=True``) and every command is a
``docker exec`` of a small ``sh`` wrapper. It is labelled ``hermes-batch.run=<run name>``,
``hermes-batch.run-id=<run folder's id>`` and ``hermes-batch.prompt=<prompt id>`` so that
:func:`reap_run_containers` can remove what a crashed run of the same run folder left behind
(two run folders with the same run name never reap each other's containers). Commands see
the image's environment plus only the names listed in ``HERMES_SANDBOX_ENV``. Defaults: no network (``network_mode="none"``), memory / CPU /
process-count limits from :class:`~hermes_core.settings.HermesSettings`, ``no-new-privileges``.

Timeouts are enforced from this side, not with ``timeout(1)`` inside the image (busybox's
``timeout`` exits 143 and kills only its direct child): each exec carries a random
``HERMES_EXEC_ID`` in its environment, and on timeout every process of the container whose
environment holds it is killed. Output is bounded like the local backend's (first 40% and
last 60%, with the same marker).

Engine facts this follows (measured, see docs/sandboxes.md): ``docker.from_env()`` honours
``DOCKER_HOST``; an unreachable engine raises ``DockerException`` or
``requests.exceptions.ConnectionError``; ``containers.create`` raises ``ImageNotFound`` for a
missing image (``containers.run`` would try to pull).

Examples:
    >>> with DockerEnvironment(image="hermes-test/busybox:1", cwd="/app") as env:  # doctest: +SKIP
    ...     env.execute("pwd").output
    '/app\\n'
"""

from __future__ import annotations

import io
import logging
import posixpath
import secrets
import tarfile
import threading
import time
from collections.abc import Callable

import docker
import docker.errors

from hermes_core.environments import ContainerSandbox, ExecResult
from hermes_core.environments._scripts import READ_SH, RUN_SH, file_argv, os_error
from hermes_core.environments.docker_engine import (
    ENGINE_ERRORS,
    LABEL_PROMPT,
    LABEL_RUN,
    LABEL_RUN_ID,
    ImageUnavailable,
    docker_client,
    ensure_image,
    own_container,
    remove_container,
    start_slots,
)
from hermes_core.environments.docker_stream import read_ahead, split_frames
from hermes_core.environments.output import BoundedOutput
from hermes_core.environments.poll import readable
from hermes_core.environments.sandbox_env import listed_environment
from hermes_core.exceptions import SandboxError

logger = logging.getLogger(__name__)


_KEEPER = ["sleep", "2147483647"]
_START_ATTEMPTS = 5
"""Containers tried for one environment when the engine fails to create or start one, or its keeper dies."""
_START_PAUSE = 0.25
"""Seconds before the second attempt, doubled before each next one (3.75 s of pauses in all)."""
# Exit 0 once the keeper runs (a process named sleep: nothing else runs in a new container), within
# ~2 s. Only sh builtins, a glob and sleep; no /proc/PID/task/PID/children (not in every kernel).
_KEEPER_UP_SH = (
    "i=0; while [ $i -lt 40 ]; do for f in /proc/[0-9]*/comm; do "
    f'read -r n < "$f" 2>/dev/null && [ "$n" = {_KEEPER[0]} ] && exit 0; done; '
    "i=$((i + 1)); sleep 0.05; done; exit 1"
)
_QUIET = 0.05
"""After the command exited, stop reading once the stream is silent this long (seconds)."""
_DRAIN_MAX = 1.0
"""After the command exited (or was killed), stop reading after this long even if a leftover child writes."""
_IDLE_CHECK = 0.2
"""Ask the engine whether the command still runs after this long without output (seconds)."""
_KILL_WAIT = 10.0
"""Longest wait for the kill of a timed-out command before returning anyway (seconds)."""

# $1 = exec id: SIGSTOP then SIGKILL every process whose environment holds it (the whole tree).
_KILL_SH = (
    'pids=; for f in /proc/[0-9]*/environ; do grep -qzxF "HERMES_EXEC_ID=$1" "$f" 2>/dev/null || continue; '
    'p=${f#/proc/}; pids="$pids ${p%/environ}"; done; '
    '[ -n "$pids" ] && { kill -STOP $pids; kill -KILL $pids; } 2>/dev/null; exit 0'
)
_PREPARE_WRITE_SH = (
    'p=$1; case $p in "~") p=$HOME;; "~/"*) p=$HOME/${p#"~/"};; esac; '
    'if [ -d "$p" ]; then exit 21; fi; '
    'if [ -L "$p" ]; then q=$(readlink -f -- "$p") && p=$q; fi; '
    'mkdir -p -- "$(dirname -- "$p")" || exit 3; '
    'd=$(cd -- "$(dirname -- "$p")" && pwd -P) || exit 3; '
    'if [ -e "$p" ]; then stat -c "%a %u %g" -- "$p"; else echo "644 $(id -u) $(id -g)"; fi; '
    'echo "$d"; basename -- "$p"'
)


# -- the environment ---------------------------------------------------------------------


class DockerEnvironment(ContainerSandbox):
    """Per-prompt sandbox in its own container.

    Args:
        cwd: working directory inside the container (the record's ``cwd``); created if
            missing. Relative paths are taken under ``/workspace``. None: ``/workspace``.
        image: image of the container (the record's ``image``); None: ``settings.terminal_docker_image``.
        settings: limits, network, timeouts and the output bound; default ``HermesSettings()``.
        run_name: value of the ``hermes-batch.run`` label.
        run_id: value of the ``hermes-batch.run-id`` label (the run folder's unique id).
        prompt_id: value of the ``hermes-batch.prompt`` label.
        **_ignored: options of other backends, accepted and ignored.

    Attributes:
        cwd: absolute working directory inside the container.
        image: the image used.
        container_id: id of the container ("" until :meth:`start`).
    """

    def __init__(self, cwd: str | None = None, image: str | None = None, **kwargs: object):
        super().__init__(cwd, image, **kwargs)
        self.container_id = ""
        self._container = None
        self._client: docker.DockerClient | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Create and start the container (bounded by ``settings.docker_max_concurrent_starts``). Idempotent.

        Returns once the container's keeper runs (one exec sees it). A container the engine fails
        to create or start, or whose keeper dies, is removed and another tried, up to
        ``_START_ATTEMPTS`` in all: Engine 20.10 on this machine kind does that now and then when
        containers start beside bubblewrap sandboxes or other containers' removal
        (:meth:`_keeper_problem`). Nothing of the prompt ran in them.

        Safe against :meth:`close` called from another thread meanwhile: a container created
        after (or while) close ran is removed at once and SandboxError is raised.

        Raises:
            ImageUnavailable: the image is absent and cannot be pulled (see :func:`~hermes_core.environments.docker_engine.ensure_image`).
            EngineUnavailable: the engine cannot be reached.
            SandboxError: no container could be created and started (the last reason named), or the
                environment was closed.
        """
        if self._closed:
            raise SandboxError("environment already closed")
        if self._container is not None:
            return
        self._client = docker_client()
        ensure_image(self.image, self.settings)
        for attempt in range(1, _START_ATTEMPTS + 1):
            problem = self._launch()
            if problem is None:
                return
            if attempt == _START_ATTEMPTS:
                raise SandboxError(f"{problem} ({_START_ATTEMPTS} containers tried)")
            logger.warning("%s; starting a new one (attempt %d of %d)", problem, attempt + 1, _START_ATTEMPTS)
            time.sleep(_START_PAUSE * 2 ** (attempt - 1))

    def _launch(self) -> str | None:
        """Create and start one container (bounded by ``docker_max_concurrent_starts``) and see its keeper run.

        Returns:
            None when it runs (it is this environment's container); else why the engine failed
            it (the container is removed): worth another attempt.

        Raises:
            ImageUnavailable: the image is absent.
            SandboxError: the environment was closed meanwhile.
        """
        s = self.settings
        labels = {LABEL_RUN: self.run_name, LABEL_RUN_ID: self.run_id, LABEL_PROMPT: self.prompt_id}
        with start_slots(s.docker_max_concurrent_starts):
            if self._closed:
                raise SandboxError("environment closed while it started")
            try:
                container = self._client.containers.create(
                    self.image,
                    entrypoint=_KEEPER[:1],
                    command=_KEEPER[1:],
                    working_dir=self.cwd,
                    labels=labels,
                    network_mode=None if s.container_network else "none",
                    mem_limit=f"{s.container_memory_mb}m",
                    memswap_limit=f"{s.container_memory_mb}m",
                    nano_cpus=int(s.container_cpus * 1e9),
                    pids_limit=s.container_pids_limit,
                    security_opt=["no-new-privileges"],
                    init=True,
                    detach=True,
                )
            except docker.errors.ImageNotFound:
                raise ImageUnavailable(self.image, "not present in the engine") from None
            except ENGINE_ERRORS as exc:
                return f"cannot create a container from {self.image!r}: {exc}"
            with self._state_lock:
                closed = self._closed
                if not closed:
                    own_container(container)
                    self._container, self.container_id = container, container.id
            if closed:  # close() ran while the engine created it: it must not outlive us
                remove_container(container)
                raise SandboxError("environment closed while it started")
            try:
                container.start()
                problem = None
            except ENGINE_ERRORS as exc:
                problem = f"cannot start the container of {self.image!r}: {exc}"
        if problem is None:
            problem = self._keeper_problem(container)  # outside the slot: starts go on meanwhile
        if problem is not None:
            with self._state_lock:
                if self._container is container:
                    self._container, self.container_id = None, ""
            remove_container(container)
        if self._closed:
            raise SandboxError("environment closed while it started")
        return problem

    def _keeper_problem(self, container) -> str | None:
        """None once the container's keeper (``sleep`` under Docker's init) runs; else what went wrong.

        Engine 20.10 here, starting containers while bubblewrap sandboxes start on the same host,
        sometimes runs a container without its root filesystem: its init exits 127 ("[FATAL tini
        (7)] exec sleep failed: No such file or directory") up to half a second after the start
        returned, and the prompt's first command then fails or comes back empty. One exec that sees
        the keeper running (a process named ``sleep``) rules that out before any command runs.
        """
        try:
            code, _ = container.exec_run(["sh", "-c", _KEEPER_UP_SH])
        except ENGINE_ERRORS:
            code = None
        if code == 0:
            return None
        return self._exit_story(container) or "the sandbox container's keeper did not start"

    @staticmethod
    def _exit_story(container) -> str | None:
        """What ended a container that no longer runs: ``the sandbox container exited (code N): <its
        last output lines>``; None while it runs or when the engine cannot tell."""
        try:
            container.reload()
            state = container.attrs.get("State", {})
            if state.get("Running"):
                return None
            last = container.logs(tail=3).decode("utf-8", "replace").strip()
        except ENGINE_ERRORS:
            return None
        return f"the sandbox container exited (code {state.get('ExitCode')}){': ' + last if last else ''}"

    def close(self, interrupted: bool = False) -> None:
        """Force-remove the container (every process in it dies). Idempotent; never raises.

        Safe from another thread while :meth:`start` runs (see there). ``interrupted`` is
        accepted for protocol compatibility (teardown is the same).
        """
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            container, self._container = self._container, None
        if container is not None:
            remove_container(container)

    # -- commands ----------------------------------------------------------------------

    def execute(self, command: str, cwd: str | None = None, timeout: float | None = None) -> ExecResult:
        """Run ``command`` with bash (else sh) ``-c`` in the container, in ``cwd``.

        Args:
            command: shell command line.
            cwd: directory in the container (relative: to the environment's cwd; ``~`` is $HOME);
                default the environment's cwd.
            timeout: seconds; default ``settings.terminal_timeout``. On timeout every process
                of this command (children included) is killed and the result has returncode 124,
                ``timed_out=True`` and the output read so far.

        Returns:
            ExecResult with merged stdout+stderr bounded by ``settings.terminal_output_max_chars``
            (first 40% + last 60% with a marker; ``truncated=True``). A missing ``cwd`` gives
            returncode 1 and a ``cd``-style message.

        Raises:
            SandboxError: not started, closed, or the engine failed.
        """
        workdir = posixpath.join(self.cwd, cwd) if cwd and not cwd.startswith("~") else (cwd or self.cwd)
        output = BoundedOutput(self.settings.terminal_output_max_chars)
        limit = timeout if timeout is not None else self.settings.terminal_timeout
        code, timed_out = self._exec(
            ["sh", "-c", RUN_SH, "hermes", workdir, cwd or self.cwd, command],
            lambda _stream, data: output.feed(data),
            limit,
        )
        output.feed(b"", final=True)
        text, truncated = output.result()
        if timed_out:
            return ExecResult(returncode=124, output=text, truncated=truncated, timed_out=True)
        return ExecResult(returncode=code, output=text, truncated=truncated)

    def _exec(self, argv: list[str], sink: Callable[[int, bytes], None], timeout: float) -> tuple[int, bool]:
        """Run ``argv`` in the container, passing output frames to ``sink(stream, bytes)``.

        Returns (exit code, timed out). Raises SandboxError when the engine fails.
        """
        container = self._container
        if container is None or self._closed:
            raise SandboxError("environment is not running (call start() first; close() ends it)")
        api = self._client.api
        token = secrets.token_hex(12)
        deadline = time.monotonic() + max(timeout, 0.0)
        environment = {**listed_environment(self.settings), "HERMES_EXEC_ID": token}
        try:
            exec_id = api.exec_create(container.id, argv, workdir="/", environment=environment)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except ENGINE_ERRORS as exc:
            raise SandboxError(self._exit_story(container) or f"docker exec failed: {exc}") from None
        raw = getattr(sock, "_sock", sock)
        timed_out = False
        try:
            timed_out = self._pump(raw, read_ahead(sock, raw), exec_id, token, deadline, sink)
        except OSError as exc:
            raise SandboxError(f"docker exec stream broke: {exc}") from None
        finally:
            sock.close()
        if timed_out:
            return 124, True
        return self._exit_code(exec_id), False

    def _pump(
        self, raw, buf: bytes, exec_id: str, token: str, deadline: float, sink: Callable[[int, bytes], None]
    ) -> bool:
        """Read the multiplexed exec stream until EOF, or the command exited and the stream went quiet.

        At ``deadline`` the command's processes are killed from another thread while this one
        keeps reading: the engine may not run the kill while the stream is backed up (measured
        with ``yes``). ``buf`` holds the stream's first bytes, read before
        (:func:`~hermes_core.environments.docker_stream.read_ahead`).
        Returns True when it timed out.
        """
        buf = split_frames(buf, sink)
        killer: threading.Thread | None = None
        kill_started = 0.0
        ended_at: float | None = None  # the command exited, or the kill is done
        last_data = time.monotonic()
        while True:
            now = time.monotonic()
            if killer is None and ended_at is None and now >= deadline:
                killer = threading.Thread(target=self._kill, args=(token,), name="hermes-kill", daemon=True)
                killer.start()
                kill_started = now
            if killer is not None and ended_at is None:
                if not killer.is_alive() or now - kill_started > _KILL_WAIT:
                    ended_at = now
            if ended_at is not None and now - ended_at > _DRAIN_MAX:
                break
            if ended_at is not None:
                wait = _QUIET
            elif killer is not None:
                wait = 0.05
            else:
                wait = min(_IDLE_CHECK, max(deadline - now, 0.0))
            pending = getattr(raw, "pending", None)
            if not (pending and pending()) and not readable(raw, wait):
                if ended_at is not None:
                    break  # the command is gone and the stream is quiet
                if (
                    killer is None
                    and time.monotonic() - last_data >= _IDLE_CHECK
                    and not self._running(exec_id)
                ):
                    ended_at = time.monotonic()
                continue
            data = raw.recv(65536)
            if not data:
                break
            last_data = time.monotonic()
            buf = split_frames(buf + data, sink)
        return killer is not None

    def _running(self, exec_id: str) -> bool:
        try:
            return bool(self._client.api.exec_inspect(exec_id).get("Running"))
        except ENGINE_ERRORS:
            return True

    def _exit_code(self, exec_id: str) -> int:
        """Exit code of a finished exec (waits up to 2 s for the engine to record it)."""
        give_up = time.monotonic() + 2.0
        while True:
            try:
                info = self._client.api.exec_inspect(exec_id)
            except ENGINE_ERRORS as exc:
                raise SandboxError(f"docker exec inspect failed: {exc}") from None
            if not info.get("Running") or time.monotonic() > give_up:
                code = info.get("ExitCode")
                return -1 if code is None else int(code)
            time.sleep(0.01)

    def _kill(self, token: str) -> None:
        """SIGKILL every process of the exec marked with ``token`` (children included)."""
        container = self._container
        if container is None:
            return  # closed: the container and every process in it are gone
        try:
            container.exec_run(["sh", "-c", _KILL_SH, "hermes-kill", token])
        except ENGINE_ERRORS as exc:
            logger.warning("could not kill a timed-out command: %s", exc)

    # -- files -------------------------------------------------------------------------

    def _capture(self, script: str, path: str) -> tuple[int, bytes, bytes]:
        """Run ``sh -c script`` in the cwd; (exit code, stdout, stderr). Timeout: ``settings.terminal_timeout``."""
        out, err = io.BytesIO(), io.BytesIO()
        code, timed_out = self._exec(
            file_argv(script, self.cwd, path),
            lambda stream, data: (err if stream == 2 else out).write(data),
            self.settings.terminal_timeout,
        )
        if timed_out:
            raise TimeoutError(f"file operation timed out after {self.settings.terminal_timeout}s")
        return code, out.getvalue(), err.getvalue()

    def read_file(self, path: str) -> bytes:
        """Return the bytes of ``path`` in the container (relative to cwd, ``~`` = $HOME).

        Raises:
            FileNotFoundError, IsADirectoryError, PermissionError: as ``open``.
            OSError: any other failure to read.
            SandboxError: not started, closed, or the engine failed.
        """
        code, data, err = self._capture(READ_SH, path)
        if code == 0:
            return data
        raise os_error(code, err, path)

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in the container, creating parent directories.

        An existing file keeps its mode and owner; a symlink is written through.

        Raises:
            IsADirectoryError, PermissionError, OSError: as ``open``/``makedirs``.
            SandboxError: not started, closed, or the engine failed.
        """
        code, out, err = self._capture(_PREPARE_WRITE_SH, path)
        lines = out.decode("utf-8", "surrogateescape").splitlines()
        if code != 0 or len(lines) < 3:
            raise os_error(code or 1, err, path)
        mode, uid, gid = lines[-3].split()
        member = tarfile.TarInfo(lines[-1])
        member.size, member.mode, member.uid, member.gid = len(data), int(mode, 8), int(uid), int(gid)
        member.mtime = int(time.time())
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(member, io.BytesIO(data))
        container = self._container
        if container is None:
            raise SandboxError("environment is not running (close() ended it)")
        try:
            container.put_archive(lines[-2], archive.getvalue())
        except docker.errors.APIError as exc:
            raise PermissionError(13, f"cannot write: {exc.explanation or exc}", path) from None
        except ENGINE_ERRORS as exc:
            raise SandboxError(f"docker put_archive failed: {exc}") from None


__all__ = ["DockerEnvironment"]
