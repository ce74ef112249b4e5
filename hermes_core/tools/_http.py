"""Bounded, retried HTTP for the web, vision and image tools (httpx + tenacity).

Every request has a timeout (a total wall-clock bound, not only httpx's
per-read one), a size bound on the body read, and bounded retries on 408, 429,
5xx, timeouts and connection errors with exponential backoff and jitter,
honouring ``Retry-After`` (RFC 9110 section 10.2.3) up to
:data:`MAX_RETRY_AFTER` seconds. What is left becomes an :class:`HttpError`
carrying the vendor's own message. Optionally each hop (redirects included) is
refused when its host resolves to a non-global address (loopback, private,
link-local, reserved): the server-side request forgery guard of ``web_extract``.
"""

from __future__ import annotations

import ipaddress
import json
import random
import socket
import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt

MAX_RETRY_AFTER = 30.0
"""Longest ``Retry-After`` honoured, seconds."""

MAX_REDIRECTS = 5
USER_AGENT = "Mozilla/5.0 (compatible; hermes-batch/0.1)"

_TRANSIENT_STATUS = {408, 425, 429}
_client: httpx.Client | None = None
_client_lock = threading.Lock()


class HttpError(Exception):
    """A request that failed for good.

    Attributes:
        status: HTTP status of the last answer, or None (timeout, connection error, size bound).
        kind: ``http``, ``timeout``, ``connection``, ``too_large`` or ``blocked``.
        retry_after: seconds the server asked to wait (429/503), or None.
    """

    def __init__(self, message: str, *, status: int | None = None, kind: str = "http", retry_after=None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """True when retrying may help: 408/425/429/5xx, timeouts and connection errors."""
        if self.kind in ("timeout", "connection"):
            return True
        return (
            self.kind == "http"
            and self.status is not None
            and (self.status in _TRANSIENT_STATUS or self.status >= 500)
        )


@dataclass(frozen=True)
class HttpResult:
    """A successful (2xx) answer: final URL, status, headers and the (bounded) body bytes."""

    url: str
    status: int
    headers: httpx.Headers
    content: bytes

    def json(self) -> Any:
        """The body parsed as JSON.

        Raises:
            HttpError: the body is not JSON (kind ``http``).
        """
        try:
            return json.loads(self.content)
        except ValueError:
            raise HttpError(f"invalid JSON in the answer of {self.url}: {self.content[:200]!r}") from None

    def text(self) -> str:
        """The body decoded with its declared charset (UTF-8 when none; invalid bytes replaced)."""
        charset = self.headers.get("content-type", "").partition("charset=")[2].split(";")[0].strip()
        try:
            return self.content.decode(charset or "utf-8", errors="replace")
        except LookupError:
            return self.content.decode("utf-8", errors="replace")


def _shared_client() -> httpx.Client:
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(follow_redirects=False, headers={"User-Agent": USER_AGENT})
        return _client


def blocked_reason(url: str) -> str | None:
    """Why ``url`` may not be fetched from here, or None.

    Refused: schemes other than http/https, and hosts that are (or resolve to) a
    non-global address: loopback, private (RFC 1918, fc00::/7), link-local
    (cloud metadata 169.254.169.254 included), shared, reserved, multicast.
    A host that does not resolve is not refused here (the fetch will fail).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or '(none)'!r} is not allowed (http and https only)"
    host = parts.hostname
    if not host:
        return "the URL has no host"
    try:
        infos = socket.getaddrinfo(host, parts.port or (443 if parts.scheme == "https" else 80))
    except (socket.gaierror, UnicodeError, ValueError):
        return None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_global or address.is_multicast:
            return f"{host} resolves to the private/internal address {address}"
    return None


def vendor_message(body: bytes) -> str:
    """The human message in an error body: ``error``/``message``/``detail`` of JSON, else the text's start."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", errors="replace").strip()
        return " ".join(text.split())[:300] or "(empty body)"
    for key in ("error", "message", "detail", "details"):
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict):
            for inner in ("message", "error", "detail"):
                if isinstance(value.get(inner), str):
                    return value[inner]
            return json.dumps(value)[:300]
        if isinstance(value, list) and value:
            first = value[0]
            if isinstance(first, dict):
                return str(first.get("msg") or first.get("message") or json.dumps(first))[:300]
            return str(first)[:300]
    return json.dumps(data)[:300]


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, min(seconds, MAX_RETRY_AFTER))


def _once(
    method: str,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    check_address: bool,
    headers: dict[str, str] | None,
    json_body: Any,
    params: dict[str, Any] | None,
) -> HttpResult:
    client = _shared_client()
    deadline = time.monotonic() + timeout
    for _ in range(MAX_REDIRECTS + 1):
        if check_address and (reason := blocked_reason(url)):
            raise HttpError(f"Blocked: {reason}", kind="blocked")
        left = deadline - time.monotonic()
        if left <= 0:
            raise HttpError(f"timed out after {timeout:g} s", kind="timeout")
        try:
            with client.stream(
                method, url, headers=headers, json=json_body, params=params, timeout=left
            ) as response:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(str(response.url), response.headers["location"])
                    method, json_body, params = "GET", None, None
                    continue
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > max_bytes:
                    raise HttpError(
                        f"response too large: {int(declared)} bytes (limit {max_bytes})", kind="too_large"
                    )
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise HttpError(f"response too large: over {max_bytes} bytes", kind="too_large")
                    if time.monotonic() > deadline:
                        raise HttpError(f"timed out after {timeout:g} s", kind="timeout")
                if response.status_code >= 400:
                    raise HttpError(
                        f"HTTP {response.status_code}: {vendor_message(bytes(body))}",
                        status=response.status_code,
                        retry_after=_retry_after(response.headers),
                    )
                return HttpResult(str(response.url), response.status_code, response.headers, bytes(body))
        except httpx.TimeoutException:
            raise HttpError(f"timed out after {timeout:g} s", kind="timeout") from None
        except httpx.TransportError as exc:
            raise HttpError(f"{type(exc).__name__}: {exc}", kind="connection") from None
    raise HttpError(f"more than {MAX_REDIRECTS} redirects", kind="http")


def _wait(state) -> float:
    """Seconds before the next attempt: the server's Retry-After, else 0.5 s doubling to 8 s plus jitter."""
    exc = state.outcome.exception()
    if isinstance(exc, HttpError) and exc.retry_after is not None:
        return exc.retry_after
    return min(8.0, 0.5 * 2 ** (state.attempt_number - 1)) + random.uniform(0, 0.5)


def request(
    method: str,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    retries: int = 2,
    check_address: bool = False,
    headers: dict[str, str] | None = None,
    json: Any = None,
    params: dict[str, Any] | None = None,
) -> HttpResult:
    """Send one request with retries; return the 2xx answer.

    Args:
        method: HTTP method.
        url: absolute URL.
        timeout: total seconds of one attempt (connect, redirects and body included).
        max_bytes: largest body read, bytes.
        retries: further attempts after a transient failure (408/425/429/5xx, timeout, connection).
        check_address: refuse hosts that resolve to non-global addresses, at every redirect hop.
        headers, json, params: as in httpx.

    Raises:
        HttpError: a non-2xx answer (``HTTP <status>: <vendor message>``), a timeout,
            a connection error, a body over ``max_bytes``, or a blocked address.
    """
    retrying = Retrying(
        retry=retry_if_exception(lambda exc: isinstance(exc, HttpError) and exc.transient),
        stop=stop_after_attempt(retries + 1),
        wait=_wait,
        reraise=True,
    )
    return retrying(
        _once,
        method,
        url,
        timeout=timeout,
        max_bytes=max_bytes,
        check_address=check_address,
        headers=headers,
        json_body=json,
        params=params,
    )
