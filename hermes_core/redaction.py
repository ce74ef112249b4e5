"""Secret redaction: every secret value this process knows is replaced by ``[REDACTED]`` (docs/architecture.md).

Defence in depth behind the sandboxes' allow-listed environments: whatever a command
manages to print (``env``, ``cat /proc/<parent>/environ``, a config file), no known secret
goes back to the model, and so none reaches a trajectory, tombstone, failure line, log line
or artifact. The model's own text passes it too (:func:`clean_for_storage`, applied to every
row before it reaches the ledger or the task cache): a model that decodes a leaked value and
writes it in its answer leaves ``[REDACTED]`` in the data. Every exception of ours redacts its
message when it is made (:class:`hermes_core.exceptions.HermesError`), any other one is
scrubbed at the prompt task's boundary (:func:`scrub_exception`), and every log record of the
process is redacted when it is made (:func:`install_log_redaction`): so a provider error that
echoes the ``Authorization`` header reaches neither the console, nor Prefect's database (logs,
task-run states, events) nor its result files.

The secrets known are

* values registered with :func:`register_secret` (the model API key given by ``--api_key``
  or loaded from a Prefect Secret block, backend keys of the settings);
* the value of every environment variable whose name looks like a credential
  (:data:`CREDENTIAL_NAME`: ``*_API_KEY``, ``*_TOKEN``, ``*_SECRET*``, ``*PASSWORD*``, ``*_KEY``)
  and whose value has at least :data:`MIN_ENV_SECRET_CHARS` characters.

Each value is matched as written, inside a JSON string (escaped), and in its common encodings
(:func:`encoded_forms`): base64 (standard and URL-safe) at each of the three byte offsets it can
start at in a longer encoded text, hexadecimal (lower and upper case), reversed and
URL-encoded. The environment is read once when the first text is redacted; :func:`refresh`
reads it again.

Cost: a text without a secret costs one substring search per known form (C speed,
~1-3 us per 10 KB per form on this project's machine); a precompiled alternation pattern
replaces the values only when one of them is present.

Examples:
    >>> r = Redactor(["sk-test-0123456789"])
    >>> r.redact("key=sk-test-0123456789 done")
    'key=[REDACTED] done'
    >>> import base64
    >>> "sk-test" in r.redact(base64.b64encode(b"the key is sk-test-0123456789").decode())
    False
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_core.exceptions import HermesError

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


MIN_ENCODED_CHARS = 8
"""Shortest encoded form (base64 middle part ...) that is matched; shorter ones would hit ordinary text."""


def encoded_forms(value: str) -> set[str]:
    """The forms a secret may take once a command or a model has re-encoded it.

    * base64, standard and URL-safe alphabets: for each offset 0, 1, 2 of the secret inside a
      longer text, the characters that encode only the secret's own bytes (the groups that mix
      in a neighbour's bits are left out), so the secret is found wherever it sits in the input;
      and the secret's own encoding whole, with and without its ``=`` padding;
    * hexadecimal, lower and upper case;
    * the secret reversed;
    * URL-encoded (``quote`` and ``quote_plus``), when that differs from the value.

    Forms shorter than :data:`MIN_ENCODED_CHARS` are left out.
    """
    raw = value.encode("utf-8", "surrogatepass")
    forms = {raw.hex(), raw.hex().upper(), value[::-1]}
    forms |= {urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value, safe="")}
    for offset in range(3):
        padded = b"\0" * offset + raw
        first = 4 if offset else 0  # the group holding the padding bytes mixes in a neighbour's bits
        last = (len(padded) // 3) * 4  # a last partial group mixes in the next byte's bits
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            forms.add(encode(padded).decode("ascii")[first:last])
    for encode in (base64.b64encode, base64.urlsafe_b64encode):  # the secret alone: its last group too
        whole = encode(raw).decode("ascii")
        forms |= {whole, whole.rstrip("=")}
    return {form for form in forms if len(form) >= MIN_ENCODED_CHARS and form != value}


def _forms(value: str) -> set[str]:
    """The value as written, JSON-escaped (inside a JSON string), and its encodings (:func:`encoded_forms`)."""
    escaped = json.dumps(value, ensure_ascii=False)[1:-1]
    ascii_escaped = json.dumps(value)[1:-1]
    return {value, escaped, ascii_escaped} | encoded_forms(value)


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


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` as valid UTF-8: a lone surrogate (``"\\ud83d"`` decoded from JSON) becomes U+FFFD.

    A surrogate pair written as two escapes (``"\\ud83d\\ude00"``) becomes the one character it
    stands for. Returns the same object when there is nothing to fix (one regex scan).
    """
    if _LONE_SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clean_for_storage(obj: Any) -> Any:
    """A JSON-like value ready to be written: every string (keys too) valid UTF-8 and redacted.

    What every row, tombstone and failure line passes before it reaches the ledger, the task
    cache or an export; ``obj`` itself is not changed.
    """
    redactor_now = redactor()

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return redactor_now.redact(valid_text(node))
        if isinstance(node, dict):
            return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [walk(v) for v in node]
        return node

    return walk(obj)


def scrub_exception(exc: BaseException) -> HermesError:
    """The :class:`~hermes_core.exceptions.HermesError` that ends a prompt for ``exc``: safe to hand
    to Prefect (state message, result store, logs), no secret in it.

    Ours (:class:`~hermes_core.exceptions.HermesError`) redact their message when made and are
    returned as they are. Any other exception becomes an
    :class:`~hermes_core.exceptions.UnexpectedError` carrying only its class name and redacted
    message (an ``OSError`` its redacted text as it was, marked ``os_error`` for the retry
    policy): none of its attributes (an HTTP error keeps the request and its headers) and none
    of its chain travel on. The result's ``usage`` and ``attempts`` are the caller's to set.
    """
    from hermes_core.exceptions import HermesError, UnexpectedError

    if isinstance(exc, HermesError):
        return exc
    return UnexpectedError(type(exc).__name__, valid_text(str(exc)), os_error=isinstance(exc, OSError))


def install_log_redaction() -> None:
    """Redact every log record of this process when it is made (message, arguments, traceback). Idempotent.

    Wraps the logging module's record factory, so it covers every logger and handler: the
    console, Prefect's API log handler (the logs table of its database) and files.
    """
    current = logging.getLogRecordFactory()
    if getattr(current, "hermes_redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = current(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the logger's problem, not ours
            message = None
        if message is not None:
            clean = redact(valid_text(message))
            if clean is not message or record.args:
                record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    factory.hermes_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


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
    "clean_for_storage",
    "credential_values",
    "encoded_forms",
    "install_log_redaction",
    "redact",
    "redactor",
    "refresh",
    "register_secret",
    "register_secrets_of",
    "scrub_exception",
    "valid_text",
]
