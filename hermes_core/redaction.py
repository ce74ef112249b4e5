"""Secret redaction: every secret value this process knows is replaced by ``[REDACTED]`` (SPEC section 12).

Defence in depth behind the sandboxes' allow-listed environments: whatever a command
manages to print (``env``, ``cat /proc/<parent>/environ``, a config file), no known secret
goes back to the model, and so none reaches a trajectory, tombstone, failure line, log line
or artifact.

The secrets known are

* values registered with :func:`register_secret` (the model API key given by ``--api_key``
  or loaded from a Prefect Secret block, backend keys of the settings);
* the value of every environment variable whose name looks like a credential
  (:data:`CREDENTIAL_NAME`: ``*_API_KEY``, ``*_TOKEN``, ``*_SECRET*``, ``*PASSWORD*``, ``*_KEY``)
  and whose value has at least :data:`MIN_ENV_SECRET_CHARS` characters.

Each value is matched as written and as it appears inside a JSON string (escaped), so a
tool result can be redacted before or after it is serialised. The environment is read once
when the first text is redacted; :func:`refresh` reads it again.

Cost: a tool result without a secret costs one substring search per known value (C speed,
~1-3 us per 10 KB on this project's machine); a precompiled alternation pattern replaces the
values only when one of them is present.

Examples:
    >>> r = Redactor(["sk-test-0123456789"])
    >>> r.redact("key=sk-test-0123456789 done")
    'key=[REDACTED] done'
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[REDACTED]"
"""What a secret value is replaced with."""

MIN_ENV_SECRET_CHARS = 8
"""Shortest value of a credential-named environment variable that is treated as a secret."""

MIN_SECRET_CHARS = 4
"""Shortest registered secret; shorter values would redact ordinary text."""

CREDENTIAL_NAME = re.compile(r"(?:_API_KEY$|_TOKEN$|_SECRET|SECRET_|^SECRET|PASSWORD|_KEY$)", re.IGNORECASE)
"""Environment variable names whose values are secrets (``OPENROUTER_API_KEY``, ``GITHUB_TOKEN``,
``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``, ``FAL_KEY`` ...)."""


def credential_values(environ: Mapping[str, str]) -> list[str]:
    """Values of the credential-named variables of ``environ`` with 8+ characters."""
    return [
        value
        for name, value in environ.items()
        if CREDENTIAL_NAME.search(name) and len(value.strip()) >= MIN_ENV_SECRET_CHARS
    ]


def _forms(value: str) -> set[str]:
    """The value as written and JSON-escaped (inside a JSON string), both when they differ."""
    escaped = json.dumps(value, ensure_ascii=False)[1:-1]
    ascii_escaped = json.dumps(value)[1:-1]
    return {value, escaped, ascii_escaped}


class Redactor:
    """Replaces a fixed set of secret values by :data:`REDACTED`. Immutable, thread-safe.

    Args:
        secrets: the secret values; values shorter than :data:`MIN_SECRET_CHARS` are ignored.
    """

    def __init__(self, secrets: Iterable[str] = ()):
        forms: set[str] = set()
        for secret in secrets:
            if isinstance(secret, str) and len(secret) >= MIN_SECRET_CHARS:
                forms |= _forms(secret)
        # longest first: a secret containing another is replaced whole
        self._values: tuple[str, ...] = tuple(sorted(forms, key=lambda v: (-len(v), v)))
        self._pattern = re.compile("|".join(map(re.escape, self._values))) if self._values else None

    def __len__(self) -> int:
        return len(self._values)

    def redact(self, text: str) -> str:
        """``text`` with every known secret replaced; the same object when none occurs."""
        if self._pattern is None or not any(value in text for value in self._values):
            return text
        return self._pattern.sub(REDACTED, text)

    def redact_obj(self, obj: Any) -> Any:
        """A copy of a JSON-like value (dicts, lists, strings) with every string redacted; keys too."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, dict):
            return {self.redact(k) if isinstance(k, str) else k: self.redact_obj(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.redact_obj(v) for v in obj]
        return obj


_lock = threading.Lock()
_registered: set[str] = set()
_current: Redactor | None = None


def register_secret(value: Any) -> None:
    """Add a secret (a ``str`` or a pydantic ``SecretStr``; None is ignored) to the process's redactor."""
    global _current
    if value is None:
        return
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if not isinstance(value, str) or len(value) < MIN_SECRET_CHARS:
        return
    with _lock:
        if value not in _registered:
            _registered.add(value)
            _current = None


def register_secrets_of(model: Any) -> None:
    """Register every ``SecretStr`` field of a pydantic model (nested models included), e.g. the settings."""
    fields = getattr(type(model), "model_fields", None)
    if not fields:
        return
    for name in fields:
        value = getattr(model, name, None)
        if hasattr(value, "get_secret_value"):
            register_secret(value)
        elif hasattr(type(value), "model_fields"):
            register_secrets_of(value)


def refresh() -> None:
    """Read the environment again at the next redaction (after variables were set or removed)."""
    global _current
    with _lock:
        _current = None


def redactor() -> Redactor:
    """The process's redactor: registered secrets plus the credential-named environment variables."""
    global _current
    current = _current
    if current is None:
        with _lock:
            if _current is None:
                _current = Redactor([*_registered, *credential_values(os.environ)])
            current = _current
    return current


def redact(text: str) -> str:
    """:meth:`Redactor.redact` with the process's redactor."""
    return redactor().redact(text)


__all__ = [
    "CREDENTIAL_NAME",
    "REDACTED",
    "Redactor",
    "credential_values",
    "redact",
    "redactor",
    "refresh",
    "register_secret",
    "register_secrets_of",
]
