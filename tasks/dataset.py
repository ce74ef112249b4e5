"""Read and validate a JSONL prompt dataset (SPEC section 4) and give each record its identity (section 9).

Pure Python + polars, no Prefect: the flow wraps :func:`read_dataset` in a task.

The file is scanned with ``polars.scan_lines`` in bounded batches (``collect_batches``), so only
one batch of raw lines is held at a time besides the valid records themselves; each line is
parsed with :func:`json.loads` (the records are heterogeneous, so a polars struct schema would
mangle the extra fields).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

__all__ = ["Dataset", "DatasetError", "PromptRecord", "read_dataset"]

_MAX_LISTED_ERRORS = 10
_BATCH_LINES = 4096  # raw lines per polars batch: bounds memory to ~4096 x line length
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


@dataclass(frozen=True, slots=True)
class Dataset:
    """A validated dataset.

    Attributes:
        path: the dataset path as given.
        records: the valid records (the first ``max_samples`` ones when set), by prompt_index.
        invalid: ``(1-based line, reason)`` of the skipped lines (only with ``skip_invalid``).
        fingerprint: sha256 hex digest of the file's bytes (whole file, even with ``max_samples``).
        total_lines: number of lines in the file, blank ones included.
    """

    path: str
    records: list[PromptRecord]
    invalid: list[tuple[int, str]]
    fingerprint: str
    total_lines: int


def read_dataset(path: str | Path, *, max_samples: int | None = None, skip_invalid: bool = False) -> Dataset:
    """Read a UTF-8 JSONL dataset of prompt records.

    Each non-blank line must be a JSON object with a non-empty string ``prompt``; ``image``,
    ``docker_image`` and ``cwd``, when present and not null, must be strings. A BOM, CRLF line
    ends and a missing final newline are accepted; blank lines are skipped (but counted in line
    numbers). The whole file is validated even when ``max_samples`` is set, so whether a file is
    accepted does not depend on it.

    Args:
        path: the JSONL file.
        max_samples: keep only the first N valid records (N >= 1); None keeps all.
        skip_invalid: skip invalid lines (listed in ``Dataset.invalid``) instead of raising.

    Returns:
        The :class:`Dataset`; memory is the records plus one batch of raw lines.

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

    records: list[PromptRecord] = []
    invalid: list[tuple[int, str]] = []
    occurrences: dict[bytes, int] = {}
    total_lines = 0
    for line_no, text in _iter_lines(file, path):
        total_lines = line_no
        if line_no == 1 and text.startswith("\ufeff"):
            text = text[1:]
        if not text.strip():
            continue
        obj, reason = _parse(text)
        if reason is not None:
            invalid.append((line_no, reason))
            continue
        if max_samples is not None and len(records) >= max_samples:
            continue  # validated, not kept
        canonical = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode("utf-8")).digest()
        occurrence = occurrences.get(digest, 0)
        occurrences[digest] = occurrence + 1
        key = hashlib.sha256(f"{canonical}#{occurrence}".encode()).hexdigest()[:32]
        records.append(
            PromptRecord(
                prompt_index=len(records),
                line=line_no,
                prompt=obj["prompt"],
                image=obj.get("image") or obj.get("docker_image") or None,
                cwd=obj.get("cwd") or None,
                source={sys.intern(k): v for k, v in obj.items() if k not in _RESERVED},
                content_key=key,
            )
        )

    if invalid and not skip_invalid:
        raise DatasetError(path, f"{len(invalid)} invalid line(s) (use --skip_invalid to skip them)", invalid)
    if not records:
        raise DatasetError(path, "no valid records in the dataset", invalid)
    with file.open("rb") as f:
        fingerprint = hashlib.file_digest(f, "sha256").hexdigest()
    return Dataset(
        path=str(path), records=records, invalid=invalid, fingerprint=fingerprint, total_lines=total_lines
    )


def _iter_lines(file: Path, shown: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(1-based line number, text without line end)`` for every line, in bounded batches."""
    lazy = pl.scan_lines(file, name="text", row_index_name="line", row_index_offset=1, glob=False)
    try:
        for batch in lazy.collect_batches(chunk_size=_BATCH_LINES):
            yield from zip(batch["line"].to_list(), batch["text"].to_list(), strict=True)
    except pl.exceptions.ComputeError as exc:
        if "utf8" not in str(exc).lower() and "utf-8" not in str(exc).lower():
            raise
        raise DatasetError(shown, _locate_bad_utf8(file)) from exc


def _locate_bad_utf8(file: Path) -> str:
    """Describe the first line of ``file`` that is not valid UTF-8 (streaming, line by line)."""
    with file.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"line {line_no} is not valid UTF-8 (byte {exc.start + 1} of the line); the dataset must be UTF-8"
    return "the file is not valid UTF-8"


def _parse(text: str) -> tuple[dict[str, Any], None] | tuple[None, str]:
    """Parse and validate one non-blank line: ``(record, None)`` or ``(None, reason)``."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg} (column {exc.colno})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object (got {_json_type(obj)})"
    if "prompt" not in obj:
        return None, "missing 'prompt'"
    prompt = obj["prompt"]
    if not isinstance(prompt, str):
        return None, f"'prompt' must be a string (got {_json_type(prompt)})"
    if not prompt.strip():
        return None, "'prompt' is empty"
    for name in ("image", "docker_image", "cwd"):
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            return None, f"'{name}' must be a string (got {_json_type(value)})"
    return obj, None


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
