"""POSIX ``sh`` snippets shared by the container backends (docker, singularity, modal).

They run in any image with a POSIX shell and busybox or coreutils: no bash, ``timeout``,
``ps`` or ``base64`` needed. Each takes its inputs as positional parameters, never by
string interpolation, so paths and commands need no quoting.
"""

from __future__ import annotations

import errno

RUN_SH = (
    'exec 2>&1; d=$1; case $d in "~") d=$HOME;; "~/"*) d=$HOME/${d#"~/"};; esac; '
    'cd -- "$d" 2>/dev/null || { echo "cd: $2: No such file or directory"; exit 1; }; '
    'if command -v bash >/dev/null 2>&1; then exec bash -c "$3"; fi; exec sh -c "$3"'
)
"""Run a command: ``$1`` directory (``~`` = $HOME), ``$2`` the directory as the caller wrote it,
``$3`` the command, with bash when the image has it, else sh; stderr goes into stdout (one
pipe keeps their order). Missing directory: exit 1 and a ``cd:`` message (as the local backend)."""

_PATH = 'p=$1; case $p in "~") p=$HOME;; "~/"*) p=$HOME/${p#"~/"};; esac; '

READ_SH = _PATH + 'if [ -d "$p" ]; then exit 21; fi; if [ ! -e "$p" ]; then exit 2; fi; exec cat -- "$p"'
"""Print the bytes of file ``$1`` on stdout; exit 2 when missing, 21 for a directory."""

WRITE_SH = _PATH + 'if [ -d "$p" ]; then exit 21; fi; mkdir -p -- "$(dirname -- "$p")" || exit 3; cat > "$p"'
"""Write stdin to file ``$1`` (parents created, symlinks followed, mode kept); exit 21 for a directory."""


def file_argv(script: str, cwd: str, path: str) -> list[str]:
    """``sh -c`` argv running ``script`` from directory ``cwd`` (``/`` when it is gone) with ``$1`` = ``path``."""
    return ["sh", "-c", f'cd -- "$0" 2>/dev/null || cd /; {script}', cwd, path]


def os_error(code: int, err: bytes, path: str) -> OSError:
    """The ``open``-style error of a failed file script from its exit code and stderr.

    Exit 2 or "No such file" -> FileNotFoundError; 21 or "Is a directory" -> IsADirectoryError;
    "Permission denied" / "Read-only" -> PermissionError; "Not a directory" -> NotADirectoryError;
    anything else -> OSError(EIO) with the message.
    """
    message = err.decode("utf-8", "replace").strip()
    if code == 2 or "No such file" in message:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    if code == 21 or "Is a directory" in message:
        return IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if "Permission denied" in message or "Read-only" in message:
        return PermissionError(errno.EACCES, "Permission denied", path)
    if "Not a directory" in message:
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
    return OSError(errno.EIO, message or f"failed with exit code {code}", path)


class ScriptedFiles:
    """``read_file`` / ``write_file`` through :data:`READ_SH` / :data:`WRITE_SH`, for a backend that
    provides ``_file_script(script, path, data) -> (exit code, stdout bytes, stderr bytes)`` (the
    script run from the sandbox's cwd with ``$1`` = path, ``data`` on stdin)."""

    def _file_script(self, script: str, path: str, data: bytes | None = None) -> tuple[int, bytes, bytes]:
        raise NotImplementedError

    def read_file(self, path: str) -> bytes:
        """Bytes of ``path`` in the sandbox (relative to cwd, ``~`` = $HOME).

        Raises:
            FileNotFoundError, IsADirectoryError, PermissionError, OSError: as ``open``.
        """
        code, out, err = self._file_script(READ_SH, path)
        if code != 0:
            raise os_error(code, err, path)
        return out

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in the sandbox, creating parent directories.

        Raises:
            IsADirectoryError, PermissionError, OSError: as ``open``/``makedirs``.
        """
        code, _, err = self._file_script(WRITE_SH, path, data)
        if code != 0:
            raise os_error(code, err, path)
