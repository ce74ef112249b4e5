"""Read and validate a JSONL prompt dataset (README § Dataset) and give each record its identity (README § Resume, retries, identity).

Pure Python, no Prefect: the flow wraps :func:`read_dataset` in a task.

The file is read once in blocks (its fingerprint computed on the way), each line parsed with
:func:`json.loads` and validated. Only a small index entry per record stays in memory (byte
offset, length, line, content key); a record's prompt and fields are read back from the file
when its prompt starts (:meth:`Dataset.record`), so memory does not grow with prompt length.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from hermes_core.redaction import valid_text
from hermes_core.scoring import check_record_fields

__all__ = ["Dataset", "DatasetError", "PromptRecord", "canonical_json", "fast_canonical_json", "read_dataset"]

_MAX_LISTED_ERRORS = 10
_BLOCK_BYTES = 8 << 20  # bytes read at a time: bounds the reader's memory to a block and a line
_BOM = b"\xef\xbb\xbf"
_RESERVED = ("prompt", "image", "docker_image", "cwd")


class DatasetError(ValueError):
    """The dataset cannot be used: missing file, not UTF-8, invalid lines, or no valid record.

    Attributes:
        path: the dataset path as given.
        errors: ``(1-based line, reason)`` of every invalid line found (may be empty).
    """

    def __init__(self, path: str | Path, message: str, errors: list[tuple[int, str]] | None = None):
        self.path = str(path)
        self.errors = list(errors or [])
        lines = [f"{self.path}: {message}"]
        for line, reason in self.errors[:_MAX_LISTED_ERRORS]:
            lines.append(f"  line {line}: {reason}")
        if len(self.errors) > _MAX_LISTED_ERRORS:
            lines.append(f"  ... and {len(self.errors) - _MAX_LISTED_ERRORS} more")
        super().__init__("\n".join(lines))


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One valid dataset record.

    Attributes:
        prompt_index: 0-based position among the valid records.
        line: 1-based line number in the file (blank lines counted).
        prompt: the prompt text (non-empty, not only whitespace; kept as written).
        image: container image from ``image`` or else ``docker_image`` (first non-empty), or None.
        cwd: working directory for the prompt's terminal, or None.
        source: every other field of the record, in file order.
        content_key: 32 hex chars, sha256 of the record's canonical JSON + ``"#<occurrence>"``;
            the n-th record with identical content gets occurrence n-1, so duplicates differ and
            reordering the file keeps the key.
    """

    prompt_index: int
    line: int
    prompt: str
    image: str | None
    cwd: str | None
    source: dict[str, Any]
    content_key: str


class Dataset:
    """A validated dataset: one small index entry per record, the records themselves stay on disk.

    A record costs ~40 bytes in memory (its byte offset and length in the file, its line number,
    its 16-byte content key; its image and cwd only when it has them), so a dataset of 10^6
    records is read, validated and given its identities in tens of MB instead of one Python
    object per record (bench/dataset_scale.py). :meth:`record` reads one record back from the file
    when its prompt starts; the file must not change meanwhile (checked: size and modification time).

    Attributes:
        path: the dataset path as given.
        records: the valid records (the first ``max_samples`` ones when set), by prompt_index: a
            sequence that reads each record from the file when it is accessed.
        invalid: ``(1-based line, reason)`` of the skipped lines (only with ``skip_invalid``).
        fingerprint: sha256 hex digest of the file's bytes (whole file, even with ``max_samples``).
    """

    __slots__ = (
        "path",
        "invalid",
        "fingerprint",
        "_file",
        "_stat",
        "_offsets",
        "_lengths",
        "_lines",
        "_keys",
        "_places",
    )

    def __init__(
        self,
        path: str,
        invalid: list[tuple[int, str]],
        fingerprint: str,
        file: Path,
        stat: tuple[int, int],
        offsets: array,
        lengths: array,
        lines: array,
        keys: bytearray,
        places: dict[int, tuple[str | None, str | None]],
    ):
        self.path = path
        self.invalid = invalid
        self.fingerprint = fingerprint
        self._file, self._stat = file, stat
        self._offsets, self._lengths, self._lines, self._keys = offsets, lengths, lines, keys
        self._places = places  # prompt_index -> (image, cwd), only for records that have one

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def records(self) -> _Records:
        """The valid records as a lazy sequence (``len``, indexing, iteration in file order)."""
        return _Records(self)

    def content_key(self, index: int) -> str:
        """The record's content key (32 hex chars), without reading the file."""
        return self._keys[16 * index : 16 * index + 16].hex()

    def content_keys(self) -> Iterator[str]:
        """Every record's content key, by prompt_index, without reading the file."""
        keys = self._keys.hex()
        return (keys[i : i + 32] for i in range(0, len(keys), 32))

    def cwds(self) -> Iterator[tuple[int, str]]:
        """``(1-based line, cwd)`` of every record that has a ``cwd``, without reading the file."""
        for index, (_image, cwd) in sorted(self._places.items()):
            if cwd is not None:
                yield self._lines[index], cwd

    def image(self, index: int) -> str | None:
        """The record's image (``image`` or else ``docker_image``), without reading the file."""
        return self._places.get(index, (None, None))[0]

    def record(self, index: int) -> PromptRecord:
        """Read record ``index`` (its prompt_index) from the file.

        Raises:
            DatasetError: the file changed since it was read (size or modification time).
            IndexError: no such record.
        """
        if not 0 <= index < len(self):
            raise IndexError(index)
        with self._file.open("rb") as fh:
            self._check_unchanged(fh)
            fh.seek(self._offsets[index])
            raw = fh.read(self._lengths[index])
        return self._build(index, raw)

    def _iter_records(self) -> Iterator[PromptRecord]:
        with self._file.open("rb") as fh:
            self._check_unchanged(fh)
            for index in range(len(self)):
                fh.seek(self._offsets[index])
                yield self._build(index, fh.read(self._lengths[index]))

    def _check_unchanged(self, fh) -> None:
        st = os.fstat(fh.fileno())
        if (st.st_size, st.st_mtime_ns) != self._stat:
            raise DatasetError(self.path, "the dataset file changed after it was read; start the run again")

    def _build(self, index: int, raw: bytes) -> PromptRecord:
        obj = _valid(json.loads(raw.decode("utf-8")))
        image, cwd = self._places.get(index, (None, None))
        return PromptRecord(
            prompt_index=index,
            line=self._lines[index],
            prompt=obj["prompt"],
            image=image,
            cwd=cwd,
            source={sys.intern(k): v for k, v in obj.items() if k not in _RESERVED},
            content_key=self.content_key(index),
        )


class _Records(Sequence):
    """The records of a :class:`Dataset`, read from its file on access."""

    def __init__(self, dataset: Dataset):
        self._dataset = dataset

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._dataset.record(i) for i in range(*index.indices(len(self)))]
        return self._dataset.record(index if index >= 0 else len(self) + index)

    def __iter__(self) -> Iterator[PromptRecord]:
        return self._dataset._iter_records()


def read_dataset(
    path: str | Path, *, max_samples: int | None = None, skip_invalid: bool = False, reuse: bool = False
) -> Dataset:
    """Read a UTF-8 JSONL dataset of prompt records.

    Each non-blank line must be a JSON object with a non-empty string ``prompt``; ``image``,
    ``docker_image`` and ``cwd``, when present and not null, must be strings; ``answer`` and
    ``verify`` as :func:`hermes_core.scoring.check_record_fields` says. A BOM, CRLF line
    ends and a missing final newline are accepted; blank lines are skipped (but counted in line
    numbers). The whole file is validated even when ``max_samples`` is set, so whether a file is
    accepted does not depend on it.

    Args:
        path: the JSONL file.
        max_samples: keep only the first N valid records (N >= 1); None keeps all.
        skip_invalid: skip invalid lines (listed in ``Dataset.invalid``) instead of raising.
        reuse: return the dataset of the previous ``reuse`` call when it read the same unchanged
            file (device, inode, size, modification time) with the same arguments: the command
            line checks the dataset, then its flow (same process) reads it, once for both.

    Returns:
        The :class:`Dataset`; memory is ~40 bytes per record plus one block of the file
        (the records are read again from the file when used).

    Raises:
        DatasetError: the file is missing or not a file, a line is not UTF-8 (always, naming
            the line), invalid lines were found and ``skip_invalid`` is false (the first 10
            are listed), or no valid record remains.
        ValueError: ``max_samples`` < 1.
    """
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, got {max_samples}")
    file = Path(path)
    if not file.is_file():
        raise DatasetError(path, "dataset file not found" if not file.exists() else "not a regular file")
    st = file.stat()
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, max_samples, skip_invalid)
    with _LAST_LOCK:
        if reuse and _LAST and _LAST[0] == key:
            return _LAST[1]
    dataset = _read(file, path, max_samples, skip_invalid)
    if reuse:
        with _LAST_LOCK:
            _LAST[:] = [key, dataset]
    return dataset


_LAST: list = []  # [key, Dataset] of the last read_dataset(reuse=True)
_LAST_LOCK = threading.Lock()


def _read(file: Path, path: str | Path, max_samples: int | None, skip_invalid: bool) -> Dataset:
    """The body of :func:`read_dataset` (no cache)."""

    offsets, lengths, lines = array("q"), array("q"), array("q")
    keys = bytearray()
    places: dict[int, tuple[str | None, str | None]] = {}
    invalid: list[tuple[int, str]] = []
    occurrences: dict[bytes, int] = {}
    digest = hashlib.sha256()
    with file.open("rb") as fh:
        stat = os.fstat(fh.fileno())
        for line_no, offset, raw in _iter_lines(fh, digest):
            if line_no == 1 and raw.startswith(_BOM):
                raw, offset = raw[len(_BOM) :], offset + len(_BOM)
            obj, canonical = fast_canonical_json(raw)
            if obj is None:  # the exact path: errors, floats, big numbers, odd whitespace
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DatasetError(
                        path,
                        f"line {line_no} is not valid UTF-8 (byte {exc.start + 1} of the line); the dataset must be UTF-8",
                    ) from None
                if not text.strip():
                    continue
                obj, reason = _parse(text)
                if reason is None:
                    canonical = canonical_json(obj)
            else:
                reason = _check(obj)
            if reason is not None:
                invalid.append((line_no, reason))
                continue
            if max_samples is not None and len(offsets) >= max_samples:
                continue  # validated, not kept
            hashed = hashlib.sha256(canonical)
            content = hashed.digest()
            occurrence = occurrences.get(content, 0)
            occurrences[content] = occurrence + 1
            hashed.update(b"#%d" % occurrence)  # = sha256(canonical + "#<occurrence>")
            keys += hashed.digest()[:16]
            image, cwd = obj.get("image") or obj.get("docker_image") or None, obj.get("cwd") or None
            if image is not None or cwd is not None:
                places[len(offsets)] = (image, cwd)
            offsets.append(offset)
            lengths.append(len(raw))
            lines.append(line_no)

    if invalid and not skip_invalid:
        raise DatasetError(path, f"{len(invalid)} invalid line(s) (use --skip_invalid to skip them)", invalid)
    if not offsets:
        raise DatasetError(path, "no valid records in the dataset", invalid)
    return Dataset(
        str(path),
        invalid,
        digest.hexdigest(),
        file,
        (stat.st_size, stat.st_mtime_ns),
        offsets,
        lengths,
        lines,
        keys,
        places,
    )


def _iter_lines(fh, digest) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(1-based line number, byte offset, bytes without line end)`` of every line of ``fh``.

    Reads blocks of :data:`_BLOCK_BYTES` (memory: one block and one line), feeding ``digest`` with
    every byte on the way (the file's fingerprint in the same pass). ``\r\n`` ends count as ``\n``.
    """
    line_no, base, rest = 0, 0, b""
    while block := fh.read(_BLOCK_BYTES):
        digest.update(block)
        data = rest + block if rest else block
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            rest = data
            continue
        pos = 0
        for raw in data[: cut - 1].split(b"\n"):
            line_no += 1
            yield line_no, base + pos, raw[:-1] if raw.endswith(b"\r") else raw
            pos += len(raw) + 1
        base += cut
        rest = data[cut:]
    if rest:
        yield line_no + 1, base, rest[:-1] if rest.endswith(b"\r") else rest


def canonical_json(obj: dict[str, Any]) -> bytes:
    """The record's canonical JSON (sorted keys, no spaces, UTF-8): what its content key hashes."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def fast_canonical_json(raw: bytes) -> tuple[dict[str, Any], bytes] | tuple[None, None]:
    """``(record, canonical JSON)`` by orjson (3-4x faster than :mod:`json`), or ``(None, None)``.

    orjson's sorted compact output is byte-for-byte :func:`canonical_json` for objects of strings,
    integers, booleans, nulls, lists and objects (tests/hermes_core/test_dataset.py checks it); for floats
    (written differently, e.g. ``1e-05``), integers beyond 64 bits (read as floats), a line that
    is not a JSON object or not valid for orjson (NaN, lone surrogates, bad UTF-8, a blank line)
    the caller takes the exact path with :mod:`json`, so identities and error messages never depend on it.
    """
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        return None, None  # maybe deeply nested: the exact path measures the depth
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, None
    if type(obj) is not dict or _has_float(obj):
        return None, None
    return obj, orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def _has_float(value: Any) -> bool:
    """True when a float is anywhere in a decoded JSON value."""
    if type(value) is dict:
        value = value.values()
    elif type(value) is not list:
        return type(value) is float
    for item in value:
        kind = type(item)
        if kind is float or ((kind is dict or kind is list) and _has_float(item)):
            return True
    return False


MAX_DEPTH = 64
"""Deepest nesting of objects and arrays a record may have (a deeper line is invalid, not a crash)."""


def _parse(text: str) -> tuple[dict[str, Any], None] | tuple[None, str]:
    """Parse and validate one non-blank line: ``(record, None)`` or ``(None, reason)``.

    Lone surrogates (a ``"\\ud800"`` escape) become U+FFFD, so every text of the record is valid
    UTF-8 from here on (its identity, its row, the cache).
    """
    if _nesting_over(text, MAX_DEPTH):
        return None, f"nested more than {MAX_DEPTH} levels deep"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg} (column {exc.colno})"
    except RecursionError:
        return None, f"nested more than {MAX_DEPTH} levels deep"
    obj = _valid(obj)
    reason = _check(obj)
    return (None, reason) if reason else (obj, None)


def _nesting_over(text: str, limit: int) -> bool:
    """True when the JSON text opens more than ``limit`` objects/arrays at once (strings skipped); linear.

    A cheap pre-check: bracket characters are counted only outside strings.
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _valid(value: Any) -> Any:
    """A decoded JSON value whose strings (keys too) are valid UTF-8 (lone surrogates -> U+FFFD)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_text(k): _valid(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid(v) for v in value]
    return value


def _check(obj: Any) -> str | None:
    """Why a decoded line is not a valid record, or None."""
    if not isinstance(obj, dict):
        return f"not a JSON object (got {_json_type(obj)})"
    if "prompt" not in obj:
        return "missing 'prompt'"
    prompt = obj["prompt"]
    if not isinstance(prompt, str):
        return f"'prompt' must be a string (got {_json_type(prompt)})"
    if not prompt.strip():
        return "'prompt' is empty"
    for name in ("image", "docker_image", "cwd"):
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            return f"'{name}' must be a string (got {_json_type(value)})"
    return check_record_fields(obj)


def _json_type(value: Any) -> str:
    """JSON type name of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
