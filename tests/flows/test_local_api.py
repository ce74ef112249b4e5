"""Prefect's local API of a command-line run (:mod:`flows.local_api`): a real server process."""

from __future__ import annotations

import socket

import httpx
import pytest

from flows.local_api import LocalAPI
from tests.conftest import prefect_home_from

pytestmark = pytest.mark.slow


def test_a_taken_port_is_left_for_a_free_one(tmp_path, monkeypatch, migrated_prefect_db):
    """Another process took the picked port before the server bound it: the server starts on another."""
    monkeypatch.setenv("PREFECT_HOME", str(prefect_home_from(migrated_prefect_db, tmp_path / "home")))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        api = LocalAPI()
        try:
            url = api.start(port=port)
            assert url != f"http://127.0.0.1:{port}/api"
            assert httpx.get(url + "/health", timeout=5).status_code == 200
        finally:
            api.stop()
    assert api.pid is None
    assert "address already in use" in api.log_path.read_text().lower()  # the first attempt's end


def test_a_server_that_cannot_start_is_an_error_naming_its_log(tmp_path, monkeypatch):
    """A server that ends for another reason is not retried: the error gives the log's path and last lines."""
    home = tmp_path / "home"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    # a database URL of a driver that does not exist: the app fails on start-up, whatever the port
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "nosuchdriver://nowhere/db")
    api = LocalAPI()
    with pytest.raises(RuntimeError) as raised:
        api.start()
    message = str(raised.value)
    assert str(home / "hermes-local-api.log") in message
    assert "nosuchdriver" in message
    assert api.pid is None
