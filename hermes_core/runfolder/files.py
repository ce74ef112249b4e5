"""Durable file writes of the run folder.

* :func:`write_json_atomic` / :func:`atomic_writer`: a temp file in the target's folder, fsync,
  then ``os.replace`` (readers never see a partial file).
* :func:`append_jsonl`: one JSON line appended with flush + fsync.
* :func:`repair_torn_tail`: cut a partial last line left by a killed writer before appending.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from hermes_core.redaction import clean_for_storage

__all__ = [
    "append_jsonl",
    "atomic_writer",
    "iter_raw_lines",
    "line_chunks",
    "loads_object",
    "repair_torn_tail",
    "write_json_atomic",
]

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[IO[bytes]]:
    """Open a binary temp file beside ``path``; on clean exit fsync it and rename it onto ``path``.

    Readers see either the old file or the complete new one, never a partial write. On an
    exception the temp file is removed and ``path`` is left untouched.

    Raises:
        OSError: the folder is not writable, the disk is full, ...
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get normal permissions
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON (ensure_ascii=False, UTF-8, final newline) to ``path`` atomically.

    Args:
        indent: as ``json.dumps``; None (one line) for large files rewritten while a run goes
            (the checkpoint, ``spend.json``): Python's C encoder then does the work, 3x faster than
            the indenting one (1.2 s -> 0.46 s for a 10^6-prompt checkpoint).

    Raises:
        TypeError: ``obj`` is not JSON-serialisable (``path`` is left untouched).
        OSError: the write or rename failed.
    """
    data = (json.dumps(obj, indent=indent, ensure_ascii=False) + "\n").encode("utf-8")
    with atomic_writer(path) as f:
        f.write(data)


def append_jsonl(fh: IO[bytes], obj: Any) -> int:
    """Append ``obj`` as one JSON line (``ensure_ascii=False``, default separators, UTF-8) and fsync.

    Every string is made valid UTF-8 and redacted first (:func:`hermes_core.redaction.clean_for_storage`):
    a lone surrogate in a model's reply can neither crash the write nor be stored, and no known
    secret reaches a ledger file, whatever wrote the row (a result cached by an older version too).

    Args:
        fh: a file opened in binary append mode (``"ab"``).

    Returns:
        The bytes written (the file grew by that much).

    Raises:
        TypeError: ``obj`` is not JSON-serialisable (nothing is written).
        OSError: the write or fsync failed.
    """
    data = (json.dumps(clean_for_storage(obj), ensure_ascii=False) + "\n").encode("utf-8")
    fh.write(data)
    fh.flush()
    os.fsync(fh.fileno())
    return len(data)


def repair_torn_tail(path: Path) -> int:
    """Remove a torn (partial) last line of a JSONL file so the next append starts a clean line.

    A last line without its newline is torn unless it is valid JSON, in which case only the
    newline is added. A missing or empty file needs nothing.

    Returns:
        The number of bytes removed (0 when nothing was cut).

    Raises:
        OSError: the file cannot be read or truncated.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "r+b") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # find the start of the last line, reading backwards in blocks
        start, block = size, 1 << 16
        while start > 0:
            lo = max(0, start - block)
            f.seek(lo)
            chunk = f.read(start - lo)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                start = lo + cut + 1
                break
            start = lo
        f.seek(start)
        tail = f.read()
        try:
            json.loads(tail)
        except ValueError:
            f.truncate(start)
            f.flush()
            os.fsync(f.fileno())
            return size - start
        f.write(b"\n")
        f.flush()
        os.fsync(f.fileno())
        return 0


def _fsync_dir(folder: Path) -> None:
    """Persist a rename in ``folder`` (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def iter_raw_lines(path: Path) -> Iterator[tuple[int, bytes, int, bool]]:
    """Yield ``(byte offset, line without line end, 1-based line number, is last line)`` of non-blank lines."""
    with open(path, "rb") as f:
        offset = 0
        pending: tuple[int, bytes, int] | None = None
        for line_no, line in enumerate(f, start=1):
            raw = line.rstrip(b"\r\n")
            if raw.strip():
                if pending is not None:
                    yield (*pending, False)
                pending = (offset, raw, line_no)
            offset += len(line)
        if pending is not None:
            yield (*pending, True)


def loads_object(raw: bytes) -> dict[str, Any] | None:
    """The JSON object in ``raw``, or None when it is not valid JSON or not an object."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def line_chunks(path: Path, size: int) -> Iterator[bytes]:
    """Yield the bytes of ``path`` in chunks of about ``size`` bytes that end on a line end (none when missing)."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        rest = b""
        while block := f.read(size):
            data = rest + block if rest else block
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            rest = data[cut:]
            if data[:cut].strip():
                yield data[:cut]
        if rest.strip():
            yield rest
