"""The native (C) agent of the bubblewrap sandboxes: built once per machine, used when it can be.

Every prompt's sandbox runs an agent (:mod:`hermes_core.environments.bwrap`). The Python one
costs ~14 ms of CPU to start, per prompt; ``sandbox_agent.c`` (next to this file, same protocol
and behaviour) costs well under one. :func:`native_agent` compiles it, the first of :data:`BUILDS`
that succeeds:

* ``musl-gcc`` (Debian ``musl-tools``), static: no dynamic loader and none of glibc's start-up,
  whose CPU-feature probe issues ~90 ``cpuid`` instructions; on a virtual machine each one traps
  to the hypervisor (6.4 us each measured here), ~0.6 ms of CPU per start, per prompt
  (``bench/results.md``). Stack protector and read-only relocations; not position-independent
  (``musl-gcc`` cannot link a static PIE), which guards little here: the agent runs as the
  sandbox's user beside the commands it runs, and the sandbox is the boundary;
* else the system compiler (``cc``, else ``gcc``) against the system libc, hardened: fortified,
  stack protector, PIE, full RELRO.

The binary goes into ``$XDG_CACHE_HOME/hermes-batch`` (default ``~/.cache/hermes-batch``), a
folder of this user with mode 0700, as ``sandbox-agent-<hash>``: the hash covers the source,
the compiler, its options and the machine type, so a changed source is built anew. The build
writes a temporary file and renames it into place, so processes building at once are safe.
Each process builds or finds it once, and runs it once (it must answer a bad argument with exit
status 2) before using it: a cached binary that cannot run here (a cache folder shared with
another system) is not used, and the next build of the list is tried.

The setting ``sandbox_agent`` (``HERMES_SANDBOX_AGENT``,
:class:`~hermes_core.settings.SandboxSettings`) chooses the agent:

* ``auto`` (default): the native agent when it can be built (a C compiler is installed, the
  build succeeds, the cache folder is safely ours), else the Python agent and one log line;
* ``native``: the native agent, or SandboxError (with the reason) when it cannot be built;
* ``python``: always the Python agent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

from hermes_core.exceptions import SandboxError

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("sandbox_agent.c")
"""The agent's C source, shipped in the package."""

CFLAGS = (
    "-O2",
    "-Wall",
    "-Wextra",
    "-U_FORTIFY_SOURCE",  # some compilers predefine it: redefining would warn
    "-D_FORTIFY_SOURCE=2",
    "-fstack-protector-strong",
    "-fPIE",
    "-pie",
    "-Wl,-z,relro,-z,now",
)
"""Compiler options of the build (warnings on; buffer checks, stack canaries, PIE, read-only relocations)."""

MUSL_CFLAGS = (
    "-O2",
    "-Wall",
    "-Wextra",
    "-fstack-protector-strong",
    "-static",
    "-Wl,-z,relro,-z,now",
)
"""Options of the ``musl-gcc`` build (warnings on; stack canaries, static, read-only relocations)."""

BUILDS = (("musl-gcc", MUSL_CFLAGS), ("cc", CFLAGS))
"""(compiler, options) in the order they are tried: the first compiler installed whose build
succeeds makes the agent (``gcc`` stands in for a missing ``cc``)."""

USAGE_EXIT = 2
"""The agent's exit status for a missing or bad socket argument (how a build is checked to run)."""

_BUILD_TIMEOUT = 120.0
"""Longest wait for the compiler, seconds."""

_lock = threading.Lock()
_mode: str | None = None  # the setting, read once per process
_built: tuple[str | None, str] | None = None  # (path, why not) once known in this process
_told = False  # the fallback's log line was written


def agent_mode() -> str:
    """The ``sandbox_agent`` setting (``auto``, ``native`` or ``python``), read once per process.

    Raises:
        SandboxError: ``HERMES_SANDBOX_AGENT`` (or another sandbox setting) is not valid.
    """
    global _mode
    with _lock:
        if _mode is None:
            from pydantic import ValidationError

            from hermes_core.settings import SandboxSettings

            try:
                _mode = SandboxSettings().sandbox_agent
            except ValidationError as exc:
                raise SandboxError(f"invalid sandbox settings: {exc}") from None
        return _mode


def native_agent(mode: str | None = None) -> str | None:
    """The path of the compiled native agent, or None when the Python agent is to be used.

    Builds it at the first call of the process if the cache does not hold it yet (a fraction of
    a second); later calls answer from memory. With ``auto``, a native agent that cannot be
    built is logged once (a warning naming the reason) and the Python one is used.

    Args:
        mode: ``auto``, ``native`` or ``python``; None: the ``sandbox_agent`` setting (:func:`agent_mode`).

    Raises:
        SandboxError: the mode is ``native`` and the agent cannot be built (the message says
            why), the mode is another value than auto, native or python, or the setting is invalid.
    """
    global _built, _told
    mode = mode or agent_mode()
    if mode not in ("auto", "native", "python"):
        raise SandboxError(f"the sandbox agent must be auto, native or python, not {mode!r}")
    if mode == "python":
        return None
    with _lock:  # one build per process, however many sandboxes start at once
        if _built is None:
            _built = build_agent(SOURCE.read_bytes() if SOURCE.is_file() else b"", cache_folder())
        path, problem = _built
        tell = path is None and mode == "auto" and not _told
        _told = _told or tell
    if path is None and mode == "native":
        raise SandboxError(
            f"HERMES_SANDBOX_AGENT=native but the native sandbox agent cannot be built: {problem}"
        )
    if tell:
        logger.warning("sandbox agent: using the Python one (about 14 ms more CPU per prompt): %s", problem)
    return path


def clear_cache() -> None:
    """Forget this process's answers (the setting, the build, the log line); the next call looks again."""
    global _mode, _built, _told
    with _lock:
        _mode, _built, _told = None, None, False


def cache_folder() -> str:
    """``$XDG_CACHE_HOME/hermes-batch`` (an absolute ``XDG_CACHE_HOME`` only), else ``~/.cache/hermes-batch``."""
    base = os.environ.get("XDG_CACHE_HOME", "")  # the XDG convention's variable, not a hermes setting
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hermes-batch")


def build_agent(source: bytes, folder: str) -> tuple[str | None, str]:
    """Find or build the agent of ``source`` (C text) in ``folder``, and check that it runs.

    Args:
        source: the C source (empty: the package lacks it).
        folder: the cache folder (made with mode 0700 if missing; refused unless safely ours).

    Returns:
        (path of the agent, "") when it is cached or built now and runs; else (None, the reason).
    """
    if not source:
        return None, f"the package lacks {SOURCE.name}"
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        return None, f"cannot create {folder}: {exc.strerror}"
    problem = _unsafe(folder, directory=True)
    if problem:
        return None, problem
    problems = []
    for compiler, flags in compilers():
        identity = [source, os.path.basename(compiler).encode(), " ".join(flags).encode()]
        digest = hashlib.sha256(b"\0".join([*identity, os.uname().machine.encode()])).hexdigest()
        target = os.path.join(folder, f"sandbox-agent-{digest[:16]}")
        if os.path.lexists(target):
            problem = _unsafe(target, directory=False)
            if problem:  # planted or tampered with: no other build stands in for it
                return None, problem
        else:
            problem = _compile(source, folder, target, compiler, flags)
        if not problem:
            path, problem = _checked(target)
            if path:
                return path, ""
        problems.append(problem)
    if not problems:
        return None, "no C compiler (musl-gcc, cc or gcc) is installed"
    return None, "; ".join(problems)


def compilers() -> list[tuple[str, tuple[str, ...]]]:
    """The installed compilers of :data:`BUILDS`, in order: [(path, options)]; ``gcc`` when ``cc`` is missing."""
    paths = [(shutil.which(name) or (name == "cc" and shutil.which("gcc")), flags) for name, flags in BUILDS]
    return [(path, flags) for path, flags in paths if path]


def _compile(source: bytes, folder: str, target: str, compiler: str, flags: tuple[str, ...]) -> str | None:
    """Compile ``source`` with ``compiler`` and ``flags`` into ``target``, through a temporary file in ``folder``.

    Returns:
        None when built, else why not (one line).
    """
    fd, temporary = tempfile.mkstemp(prefix=".sandbox-agent-", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                [compiler, *flags, "-x", "c", "-o", temporary, "-"],
                input=source,  # the bytes hashed, even if the file changes meanwhile
                capture_output=True,
                timeout=_BUILD_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot run {compiler}: {exc}"
        if done.returncode != 0:
            errors = done.stderr.decode("utf-8", "replace").strip()
            return f"{compiler} failed (exit {done.returncode}): {errors[-500:]}"
        os.chmod(temporary, 0o755)
        os.replace(temporary, target)  # atomic: another process sees no file or a whole one
    except OSError as exc:
        return f"cannot write {target}: {exc.strerror}"
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    return None


def _checked(path: str) -> tuple[str | None, str]:
    """(path, "") when the agent at ``path`` runs here (a bad argument: exit :data:`USAGE_EXIT`), else (None, why)."""
    try:
        done = subprocess.run([path], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} does not run here: {exc}"
    if done.returncode != USAGE_EXIT:
        errors = done.stderr.decode("utf-8", "replace").strip()
        return None, f"{path} does not run here (exit {done.returncode}): {errors[-300:]}"
    return path, ""


def _unsafe(path: str, *, directory: bool) -> str | None:
    """Why ``path`` (the cache folder, or the agent in it) is not safely ours, or None.

    Safe: not a symlink, of the expected kind, owned by this user, writable by nobody else; the
    folder is then tightened to mode 0700 (no one else may read or enter it).
    """
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot inspect {path}: {exc.strerror}"
    kind = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not kind:
        return f"{path} is not a {'folder' if directory else 'regular file'}"
    if info.st_uid != os.geteuid():
        return f"{path} belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"{path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    if directory and stat.S_IMODE(info.st_mode) != 0o700:
        try:
            os.chmod(path, 0o700)
        except OSError as exc:
            return f"cannot make {path} private: {exc.strerror}"
    return None


__all__ = [
    "BUILDS",
    "CFLAGS",
    "MUSL_CFLAGS",
    "SOURCE",
    "USAGE_EXIT",
    "agent_mode",
    "build_agent",
    "cache_folder",
    "clear_cache",
    "compilers",
    "native_agent",
]
