"""Run the mock model (a test double) in the foreground.

Usage: ``python -m hermes_core.mockllm --port N [--host 127.0.0.1] [--request-log PATH]``.
Prints the base URL (``http://HOST:PORT/v1``) on one line once the port is
listening, then serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse

import uvicorn

from hermes_core.mockllm._server import _bind, _url_host, create_app


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, serve until interrupted; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m hermes_core.mockllm",
        description="Serve the deterministic mock/ model (a test double) over OpenAI-compatible HTTP.",
    )
    parser.add_argument("--port", type=int, required=True, help="TCP port (0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--request-log", default=None, help="append one JSON line per request to this file")
    args = parser.parse_args(argv)
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        parser.exit(1, f"error: cannot listen on {args.host}:{args.port}: {exc}\n")
    port = sock.getsockname()[1]
    print(f"http://{_url_host(args.host)}:{port}/v1", flush=True)
    config = uvicorn.Config(create_app(request_log=args.request_log), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["main"]
