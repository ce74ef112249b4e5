"""Serve an ASGI app with real uvicorn on a free 127.0.0.1 port in a thread (for HTTP and browser tests)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

from tests.conftest import free_port


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """Run ``app`` until the block ends; yields its base URL (``http://127.0.0.1:<port>``)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="viewer-under-test", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the app under test did not start")
        time.sleep(0.02)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(10)
