"""The docker backend's exec stream when the engine writes the output together with its headers.

A real ``docker.APIClient`` talks HTTP to a local Unix-socket server that answers ``exec start`` the
way the engine does (``101 UPGRADED``, then the multiplexed frames), but in one write: what a loaded
machine produced now and then with the real engine (the client parses the headers late, and its
buffered reader has already taken the frames). The real engine cannot be made to do it on demand.
"""

from __future__ import annotations

import socket
import struct
import threading

import docker

from hermes_core.environments.docker_stream import read_ahead, split_frames

HEADERS = (
    b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def _engine_answering(path: str, body: bytes, hold: threading.Event | None = None) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn, server:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            head, _, rest = request.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(rest) < length:
                rest += conn.recv(4096)
            conn.sendall(HEADERS + body)  # headers and the whole output in one write
            if hold is not None:
                hold.wait(10)  # the stream stays open

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_output_sent_with_the_headers_is_not_lost(tmp_path):
    path = str(tmp_path / "engine.sock")
    body = frame(1, b"ok\n") + frame(2, b"warning\n") + frame(1, b"tail")[:6]  # the last frame incomplete
    server = _engine_answering(path, body)
    api = docker.APIClient(base_url=f"unix://{path}", version="1.41")
    sock = api.exec_start("exec-id", socket=True)
    raw = getattr(sock, "_sock", sock)
    timeout = raw.gettimeout()
    got: list[tuple[int, bytes]] = []
    rest = split_frames(read_ahead(sock, raw), lambda stream, data: got.append((stream, data)))
    assert got == [(1, b"ok\n"), (2, b"warning\n")]
    assert rest == frame(1, b"tail")[:6]
    server.join(5)
    assert raw.recv(10) == b""  # nothing else came: without the read-ahead the output was gone
    assert raw.gettimeout() == timeout  # as before: the stream's reader relies on it
    sock.close()


def test_nothing_read_ahead_returns_at_once(tmp_path):
    """The engine sent only its headers and keeps the stream open (a command that has not written yet)."""
    path = str(tmp_path / "engine.sock")
    hold = threading.Event()
    server = _engine_answering(path, b"", hold)
    api = docker.APIClient(base_url=f"unix://{path}", version="1.41")
    sock = api.exec_start("exec-id", socket=True)
    raw = getattr(sock, "_sock", sock)
    assert read_ahead(sock, raw) == b""  # would block for the client's 60 s timeout otherwise
    hold.set()
    server.join(5)
    sock.close()
