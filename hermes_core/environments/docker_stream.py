"""Reading Docker's exec stream: its multiplexed frames, and the bytes docker-py read ahead.

The engine answers ``POST /exec/{id}/start`` with ``101 UPGRADED`` and then the command's output as
frames (Docker Engine API, "Attach to a container": 1 byte stream, 3 zero bytes, 4 bytes big-endian
payload size, the payload). :class:`~hermes_core.environments.docker.DockerEnvironment` reads the
raw socket docker-py hands back; these two functions are the parts of that reading a test can drive
without an engine.
"""

from __future__ import annotations

import struct
from collections.abc import Callable


def split_frames(buf: bytes, sink: Callable[[int, bytes], None]) -> bytes:
    """Pass each whole frame of Docker's multiplexed stream in ``buf`` to ``sink(stream, payload)``;
    returns the bytes of an incomplete last frame. Frame: 1 byte stream, 3 zero, 4 bytes big-endian size."""
    while len(buf) >= 8:
        stream, size = struct.unpack(">BxxxL", buf[:8])
        if len(buf) < 8 + size:
            break
        sink(stream, buf[8 : 8 + size])
        buf = buf[8 + size :]
    return buf


def read_ahead(sock, raw) -> bytes:
    """The bytes of an exec's stream that the HTTP client read past the response headers.

    ``exec_start(socket=True)`` hands back the raw socket, but http.client parsed the headers
    through a buffered reader, which may already hold the first frames: a quick command's whole
    output when the engine wrote it at once (measured: 12 of 400 ``echo`` commands on a loaded
    machine came back empty, exit code 0; none since).

    Args:
        sock: what ``APIClient.exec_start(..., socket=True)`` returned (docker-py keeps the HTTP
            response on it as ``_response``: ``APIClient._get_raw_response_socket``).
        raw: the socket read from afterwards; its timeout is the same after the call.

    Returns:
        The buffered bytes (read without blocking); b"" when none, or for a transport without that
        response (docker-py's ssh and npipe ones).
    """
    try:
        reader = sock._response.raw._fp.fp  # urllib3's response -> http.client's -> its buffered reader
    except AttributeError:
        return b""
    timeout = raw.gettimeout()
    raw.setblocking(False)
    try:
        return reader.read1(65536) or b""
    except (BlockingIOError, InterruptedError):
        return b""
    finally:
        raw.settimeout(timeout)


__all__ = ["read_ahead", "split_frames"]
