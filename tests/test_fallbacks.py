"""Model fallbacks (issue 27 item 3): a primary alias whose provider refuses connections
hands the trace to its fallback alias, and the trace says which model answered."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

import fleet.llm.base
from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.llm.config import load_config
from fleet.settings import Settings
from fleet.storage.memory_store import MemoryStore
from fleetops.cli.output import render_tree


def closed_port() -> int:
    """A loopback port nobody listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("fallback", ["nowhere", "primary"])
def test_a_fallback_must_be_another_alias(tmp_path: Path, fallback: str) -> None:
    models = {"primary": {"provider": "openai", "name": "x", "fallbacks": [fallback]}}
    path = write_yaml(tmp_path / "fleet.yaml", {"models": models})
    with pytest.raises(ConfigError, match="models.primary.fallbacks") as raised:
        load_config(path, {})
    assert "\n" not in str(raised.value)


def test_a_refused_primary_falls_back_and_the_trace_says_who_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)  # loopback only
    (operator := tmp_path / "operator").mkdir()
    (workspace := tmp_path / "workspace").mkdir()
    script = write_yaml(operator / "backup.yaml", {"scripts": [{"steps": [{"content": "ok"}]}]})
    config = {
        "providers": {"down": {"kind": "openai", "base_url": f"http://127.0.0.1:{closed_port()}/v1"}},
        "models": {
            "primary": {"provider": "down", "name": "m", "fallbacks": ["backup"]},
            "backup": {"provider": "scripted", "name": str(script)},
        },
    }  # fmt: skip
    path = write_yaml(operator / "fleet.yaml", config)
    settings = Settings(workspace=workspace, env={}, config_path=path, allow_scripted=True)
    inline = InProcessFleet.from_settings(settings)

    trace = inline.run("answer", model="primary")

    assert trace.status == "completed" and trace.answer == "ok"
    assert trace.model == "backup"
    (moved,) = trace.metadata["model_fallbacks"]
    assert (moved["from"], moved["to"]) == ("primary", "backup")
    assert "\n" not in moved["error"]
    answered = [m.model for m in inline.store.messages(trace.trace_id) if m.role == "assistant"]
    assert answered == ["backup"]
    assert isinstance(inline.store, MemoryStore)
    shown = "\n".join(render_tree(inline.store, trace))
    assert "model: backup (after primary: " in shown
