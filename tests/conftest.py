"""Shared fixtures: the mock model server over real HTTP, and a clean environment for Prefect."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def mock_server():
    """One mock model server (real uvicorn on 127.0.0.1) for the whole session."""
    from hermes_core.mockllm import MockServer

    with MockServer() as server:
        yield server
