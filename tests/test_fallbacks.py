"""Model fallbacks (issue 27 item 3): a primary alias whose provider refuses connections
hands the trace to its fallback alias, and the trace says which model answered."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import redis
import yaml
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fleet.llm.base
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import ConfigError
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.config import load_config
from fleet.llm.openai import OpenAIClient
from fleet.loop.runner import Runner, run_to_end
from fleet.observe.otel_spans import OtelHooks
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import Script
from fleetops.cli.output import render_tree
from fleetops.metrics import fallback_family, render
from tests.fake_provider import RateLimitedProvider
from tests.test_fleet_recovery import database_url

FALLBACK_DB = 5


def closed_port() -> int:
    """A loopback port nobody listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def close_all(inline: InProcessFleet) -> None:
    """The HTTP clients the run built, and the Redis store."""
    for model in inline.runtime.clients.values():
        if isinstance(model, OpenAIClient):
            model.close()
    if isinstance(inline.store, RedisStore):
        inline.store.close()


def write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("fallback", ["nowhere", "primary"])
def test_a_fallback_must_be_another_alias(tmp_path: Path, fallback: str) -> None:
    models = {"primary": {"provider": "openai", "name": "x", "fallbacks": [fallback]}}
    path = write_yaml(tmp_path / "fleet.yaml", {"models": models})
    with pytest.raises(ConfigError, match="models.primary.fallbacks") as raised:
        load_config(path, env={})
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

    try:
        trace = inline.run("answer", model="primary")
    finally:
        close_all(inline)

    assert trace.status == "completed" and trace.answer == "ok"
    assert trace.model == "backup"
    (moved,) = trace.run.model_fallbacks
    assert (moved.from_model, moved.to) == ("primary", "backup")
    assert "\n" not in moved.error
    answered = [m.model for m in inline.store.messages(trace.trace_id) if m.role == "assistant"]
    assert answered == ["backup"]
    assert isinstance(inline.store, MemoryStore)
    shown = "\n".join(render_tree(inline.store, trace))
    assert "model: backup (after primary: " in shown


@pytest.mark.integration
def test_a_provider_pause_longer_than_max_wait_s_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)  # loopback only
    (operator := tmp_path / "operator").mkdir()
    (workspace := tmp_path / "workspace").mkdir()
    script = write_yaml(operator / "backup.yaml", {"scripts": [{"steps": [{"content": "ok"}]}]})
    late = Script.parse({"scripts": [{"steps": [{"content": "late"}]}]}, "provider")
    with RateLimitedProvider(late) as paused:
        paused.refuse_once(after_answered=0, retry_after_s=600)
        busy = {"kind": "openai", "base_url": f"{paused.url}/v1", "limits": {"max_concurrency": 4}}
        primary = {"provider": "busy", "name": "m", "fallbacks": ["backup"], "max_wait_s": 5}
        backup = {"provider": "scripted", "name": str(script)}
        config = {"providers": {"busy": busy}, "models": {"primary": primary, "backup": backup}}
        path = write_yaml(operator / "fleet.yaml", config)
        settings = Settings(
            workspace=workspace,
            env={},
            config_path=path,
            allow_scripted=True,
            redis_url=database_url(redis_url, FALLBACK_DB),
        )
        inline = InProcessFleet.from_settings(settings, redis=True)
        started = time.monotonic()
        try:
            trace = inline.run("answer", model="primary")
        finally:
            close_all(inline)

    assert time.monotonic() - started < 30  # not the provider's 600 s pause
    assert trace.status == "completed" and trace.answer == "ok" and trace.model == "backup"
    (moved,) = trace.run.model_fallbacks
    assert (moved.from_model, moved.to) == ("primary", "backup")
    assert paused.stats.refused == 1


def test_a_fallback_is_counted_for_metrics_and_named_on_the_chat_spans(
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
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = MemoryStore()
    hooks = OtelHooks(store, provider.get_tracer("test"))
    runtime = Runtime.build(settings, store, InProcessDispatcher(), hooks=hooks)
    root = create_root(runtime, TaskSpec("answer", "primary"))

    try:
        run_to_end(Runner(runtime), root.trace_id)
    finally:
        for model in runtime.clients.values():
            if isinstance(model, OpenAIClient):
                model.close()

    assert store.get_trace(root.trace_id).status == "completed"
    assert dict(store.fallbacks) == {("primary", "backup"): 1}
    spans = exporter.get_finished_spans()
    chats = [dict(s.attributes or {}) for s in spans if s.name.startswith("chat")]
    assert [c["gen_ai.request.model"] for c in chats] == ["primary", "backup"]
    assert "fleet.model.fallback" not in chats[0]  # the call that failed was the primary's
    assert chats[1]["fleet.model.fallback"] is True
    assert (chats[1]["fleet.model.fallback_from"], chats[1]["fleet.model.fallback_count"]) == (
        "primary",
        1,
    )


def test_fleet_metrics_exports_the_fallbacks_by_from_and_to(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    store.count_fallback("primary", "backup")
    store.count_fallback("primary", "backup")
    store.count_fallback("backup", 'odd"name')
    redis_db.hset("fleet:model-fallbacks", "not json", 7)  # not a field the fleet wrote

    family = fallback_family(redis_db)
    text = render([family])

    assert family.samples == {
        (("from", "primary"), ("to", "backup")): 2.0,
        (("from", "backup"), ("to", 'odd"name')): 1.0,
    }
    assert 'fleet_model_fallbacks_total{from="primary",to="backup"} 2' in text
    assert 'to="odd\\"name"' in text  # a label value is escaped, never breaks the format
