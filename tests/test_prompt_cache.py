"""Prompt caching (issue 27 item 4): breakpoints, `prompt_cache_key`, cached tokens in
stats and cost, against a local provider that keeps a cache and reports it in usage."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

import fleet.llm.base
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import ModelBehaviorError
from fleet.inprocess import InProcessFleet
from fleet.limits.budget import Budget
from fleet.llm.anthropic import AnthropicClient
from fleet.llm.base import ToolCall
from fleet.llm.caching import MAX_BREAKPOINTS, cache_key, mark_breakpoints
from fleet.llm.config import load_config, resolve_target
from fleet.llm.openai import OpenAIClient
from fleet.llm.pricing import CachedTokens, ModelPricing, cost_usd
from fleet.loop.runner import Runner, run_to_end
from fleet.models import Event, Message, Trace
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleet.testing import Script
from fleetops.cli.output import render_tree
from tests.fake_cache_provider import CachingProvider

EPHEMERAL = {"type": "ephemeral"}
SCRIPT = Script.parse(
    {
        "scripts": [
            {
                "match": ".*",
                "steps": [
                    {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]},
                    {"tool_calls": [{"name": "list_dir", "arguments": {"path": "sub"}}]},
                    {"content": "done"},
                ],
            }
        ]
    },
    "cache-script",
)


@pytest.fixture
def allow_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)  # loopback only


def tool(name: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": "d", "parameters": schema},
    }


def history() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a careful reader. " * 40},
        {"role": "user", "content": "Compare a.txt and b.txt"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [ToolCall("call_a", "read_file", '{"path": "a.txt"}').to_openai()],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "A" * 400},
        {"role": "assistant", "content": "And b.", "tool_calls": [
            ToolCall("call_b", "read_file", '{"path": "b.txt"}').to_openai()]},
        {"role": "tool", "tool_call_id": "call_b", "content": "B" * 400},
    ]  # fmt: skip


def marks(body: dict[str, Any]) -> list[str]:
    """Where the body's breakpoints are, in prefix order."""
    found = [f"tool:{t['name']}" for t in body.get("tools", []) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        found += ["system" for b in system if b.get("cache_control") == EPHEMERAL]
    for i, turn in enumerate(body["messages"]):
        found += [
            f"message:{i}:{j}"
            for j, b in enumerate(turn["content"])
            if b.get("cache_control") == EPHEMERAL
        ]
    return found


@pytest.mark.usefixtures("allow_requests")
def test_the_anthropic_request_carries_breakpoints_on_tools_system_and_conversation() -> None:
    sent = history()
    before = json.dumps(sent)
    with CachingProvider(SCRIPT) as server:
        client = AnthropicClient(server.url, "k", "claude-sonnet-4-5")
        client.complete(sent, [tool("read_file"), tool("list_dir")])
        client.close()

    (body,) = server.seen
    # the last tool (every schema), the system prompt, the last user turn (the whole
    # conversation) and the user turn before it (what the previous call cached)
    assert marks(body) == ["tool:list_dir", "system", "message:2:0", "message:4:0"]
    assert body["system"][0]["text"].startswith("You are a careful reader.")
    assert len(marks(body)) <= MAX_BREAKPOINTS
    assert json.dumps(sent) == before  # the history it was given is not marked


def test_breakpoints_hidden_in_content_parts_are_dropped_so_the_limit_holds() -> None:
    hostile = [{"type": "text", "text": f"p{i}", "cache_control": EPHEMERAL} for i in range(6)]
    body = {
        "system": "s",
        "tools": [{"name": "t", "input_schema": {}}],
        "messages": [{"role": "user", "content": hostile}],
    }

    mark_breakpoints(body)

    assert marks(body) == ["tool:t", "system", "message:0:5"]
    assert hostile[0]["cache_control"] == EPHEMERAL  # the caller's parts are left as they were


def test_an_alias_may_turn_prompt_caching_off(tmp_path: Path) -> None:
    models = {"m": {"provider": "anthropic", "name": "claude-haiku-4-5", "prompt_cache": False}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    target = resolve_target(load_config(path, env={}), "m")
    client = AnthropicClient("http://x", "k", target.model, prompt_cache=target.prompt_cache)

    body = client.request_body(history(), [tool("read_file")])

    assert marks(body) == [] and body["system"].startswith("You are")


@pytest.mark.usefixtures("allow_requests")
def test_anthropic_cache_reads_and_writes_are_read_into_usage_at_the_cached_price() -> None:
    with CachingProvider(SCRIPT) as server:
        client = AnthropicClient(server.url, "k", "claude-sonnet-4-5")
        first = client.complete(history()[:2], [tool("read_file")]).usage
        second = client.complete(history(), [tool("read_file")]).usage
        client.close()

    assert first.cached_tokens == 0 and first.cache_write_tokens > 0  # written, nothing read
    assert second.cached_tokens > 0  # tools + system + the first turn, from the cache
    fresh = second.prompt_tokens - second.cached_tokens - second.cache_write_tokens
    expected = (
        fresh * 3.00 + second.cached_tokens * 0.30 + second.cache_write_tokens * 3.75
        + second.completion_tokens * 15.00
    ) / 1e6  # fmt: skip
    assert second.cost_usd == pytest.approx(expected)
    assert second.cost_usd < cost_usd("claude-sonnet-4-5", second.prompt_tokens, 1)


@pytest.mark.usefixtures("allow_requests")
def test_openai_sends_a_prompt_cache_key_and_reads_cached_tokens_at_the_cached_price() -> None:
    key = cache_key("root-1", "default")
    with CachingProvider(SCRIPT) as server:
        client = OpenAIClient(f"{server.url}/v1", "", "gpt-4o-mini")
        client.complete(history()[:2], [tool("read_file")], cache_key=key)
        usage = client.complete(history(), [tool("read_file")], cache_key=key).usage
        other = client.complete(history(), [tool("read_file")], cache_key="fleet-other").usage
        client.close()

    assert [body["prompt_cache_key"] for body in server.seen] == [key, key, "fleet-other"]
    assert 0 < usage.cached_tokens < usage.prompt_tokens and usage.cache_write_tokens == 0
    assert other.cached_tokens == 0  # another key is another cache
    fresh = usage.prompt_tokens - usage.cached_tokens
    expected = (fresh * 0.15 + usage.cached_tokens * 0.075 + usage.completion_tokens * 0.60) / 1e6
    assert usage.cost_usd == pytest.approx(expected)


def test_alias_cache_prices_override_and_unset_ones_are_the_providers_share(
    tmp_path: Path,
) -> None:
    models = {
        "set": {"provider": "openai", "name": "mine", "input_usd_per_mtok": 2.0,
                "output_usd_per_mtok": 4.0, "cached_input_usd_per_mtok": 0.2},
        "unset": {"provider": "anthropic", "name": "mine", "input_usd_per_mtok": 2.0,
                  "output_usd_per_mtok": 4.0},
    }  # fmt: skip
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    config = load_config(path, env={})
    cached = CachedTokens(read=1_000_000, written=1_000_000)

    mine = resolve_target(config, "set")
    theirs = resolve_target(config, "unset")

    assert mine.pricing == ModelPricing(2.0, 4.0, 0.2, None)
    # 1M fresh at $2, 1M read at $0.2, 1M written at OpenAI's 1x input
    assert cost_usd("mine", 3_000_000, 0, mine.pricing, cached=cached) == pytest.approx(4.2)
    # Anthropic's shares of the input price: reads 0.1x, writes 1.25x
    priced = cost_usd("mine", 3_000_000, 0, theirs.pricing, cached=cached, kind="anthropic")
    assert priced == pytest.approx(2.0 + 0.2 + 2.5)


@pytest.mark.parametrize("bad", [-5, "many", None, True, 10**6 + 0.5])
def test_odd_cached_counts_from_a_provider_never_make_cost_negative_or_crash(bad: Any) -> None:
    raw = {
        "prompt_tokens": 100,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": bad},
    }
    client = OpenAIClient("http://x/v1", "", "gpt-4o-mini")
    usage = client._usage(raw)
    client.close()

    assert 0 <= usage.cached_tokens <= 100
    assert usage.cost_usd >= 0


def test_a_cached_count_past_any_context_window_is_that_calls_error() -> None:
    raw = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 10**12 + 0.5}}
    client = OpenAIClient("http://x/v1", "", "gpt-4o-mini")
    try:
        with pytest.raises(ModelBehaviorError, match="cached_tokens"):
            client._usage(raw)
    finally:
        client.close()


def test_a_turn_with_cached_tokens_adds_them_to_the_trace_stats(store: TraceStore) -> None:
    store.create_trace(Trace(trace_id="t1", root_trace_id="t1", task="x", model="m"))
    turn = Message(trace_id="t1", role="assistant", content="a", model="m", prompt_tokens=900)
    turn = turn.model_copy(update={"completion_tokens": 5, "cost_usd": 0.001})
    turn = turn.model_copy(update={"cached_tokens": 800, "cache_write_tokens": 50})
    event = Event(kind="message", trace_id="t1", data={"role": "assistant"})

    store.record_turn("t1", turn, event, iteration=1)
    store.record_turn("t1", turn, event, iteration=2)

    stats = store.get_trace("t1").stats
    assert (stats.prompt_tokens, stats.cached_tokens, stats.cache_write_tokens) == (1800, 1600, 100)
    (first, _) = store.messages("t1")
    assert (first.cached_tokens, first.cache_write_tokens) == (800, 50)


def fleet_for(
    tmp_path: Path,
    kind: str,
    url: str,
    env: dict[str, str] | None = None,
    store: TraceStore | None = None,
) -> InProcessFleet:
    (operator := tmp_path / "operator").mkdir()
    (workspace := tmp_path / "workspace").mkdir()
    (workspace / "sub").mkdir()
    base = f"{url}/v1" if kind == "openai" else url
    name = "gpt-4o-mini" if kind == "openai" else "claude-haiku-4-5"
    config = {
        "providers": {"cache": {"kind": kind, "base_url": base}},
        "models": {"m": {"provider": "cache", "name": name}},
    }
    path = operator / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    settings = Settings(workspace=workspace, env=env or {}, config_path=path)
    return InProcessFleet.from_settings(settings, store=store)


def close_clients(inline: InProcessFleet) -> None:
    for client in inline.runtime.clients.values():
        if isinstance(client, OpenAIClient | AnthropicClient):
            client.close()


@pytest.mark.usefixtures("allow_requests")
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_run_counts_cached_tokens_in_its_stats_and_cost_at_the_cached_price(
    tmp_path: Path, kind: str
) -> None:
    with CachingProvider(SCRIPT) as server:
        inline = fleet_for(tmp_path, kind, server.url)
        try:
            trace = inline.run("look around", model="m")
        finally:
            close_clients(inline)

    assert trace.status == "completed" and trace.answer == "done"
    turns = [m for m in inline.store.messages(trace.trace_id) if m.role == "assistant"]
    assert len(turns) == 3 and turns[0].cached_tokens == 0
    assert all(t.cached_tokens > 0 for t in turns[1:])  # each turn reads the one before
    assert trace.stats.cached_tokens == sum(t.cached_tokens for t in turns)
    assert trace.stats.cached_tokens == server.stats.cached_tokens
    assert trace.stats.cache_write_tokens == server.stats.cache_write_tokens
    assert trace.stats.prompt_tokens == server.stats.prompt_tokens
    name = "gpt-4o-mini" if kind == "openai" else "claude-haiku-4-5"
    priced = [
        cost_usd(name, t.prompt_tokens, t.completion_tokens, kind=kind,
                 cached=CachedTokens(t.cached_tokens, t.cache_write_tokens))
        for t in turns
    ]  # fmt: skip
    assert [t.cost_usd for t in turns] == pytest.approx(priced)
    assert trace.stats.cost_usd == pytest.approx(sum(priced))
    full = sum(cost_usd(name, t.prompt_tokens, t.completion_tokens) for t in turns)
    if kind == "openai":  # cached input at half the input price, and nothing for writes
        assert 0 < trace.stats.cost_usd < full
    shown = render_tree(inline.store, trace)[0]
    assert f"tokens ({trace.stats.cached_tokens} cached)" in shown


@pytest.mark.usefixtures("allow_requests")
def test_the_cache_key_carries_no_task_text_and_no_secret(tmp_path: Path) -> None:
    secret = "sk-live-0123456789abcdefSECRET"
    with CachingProvider(SCRIPT) as server:
        inline = fleet_for(tmp_path, "openai", server.url, env={"OPENAI_API_KEY": secret})
        try:
            first = inline.run(f"look around; my password is {secret}", model="m")
            second = inline.run("look around again", model="m")
        finally:
            close_clients(inline)

    keys = [body["prompt_cache_key"] for body in server.seen]
    assert len(keys) == 6 and len(set(keys[:3])) == 1 and len(set(keys[3:])) == 1
    assert keys[0] != keys[3]  # one key per tree (and preset), not one for the whole fleet
    assert keys[0] == cache_key(first.trace_id, "default")
    assert keys[3] == cache_key(second.trace_id, "default")
    for key in keys:
        assert re.fullmatch(r"fleet-[0-9a-f]{32}", key)
        assert secret not in key and "password" not in key and first.trace_id not in key


@pytest.mark.usefixtures("allow_requests")
def test_a_budget_spends_cached_tokens_at_the_cached_price(
    tmp_path: Path, redis_db: redis.Redis
) -> None:
    with CachingProvider(SCRIPT) as server:
        inline = fleet_for(tmp_path, "openai", server.url, store=RedisStore(redis_db))
        root = create_root(inline.runtime, TaskSpec("look around", "m", budget=Budget(usd=1.0)))
        try:
            run_to_end(Runner(inline.runtime), root.trace_id)
        finally:
            close_clients(inline)

    trace = inline.store.get_trace(root.trace_id)
    assert trace.status == "completed" and trace.stats.cached_tokens > 0
    state = inline.runtime.gate.budgets.state(root.trace_id)  # type: ignore[union-attr]
    assert state is not None
    assert state.used_usd == pytest.approx(trace.stats.cost_usd)
    assert state.used_tokens == trace.stats.prompt_tokens + trace.stats.completion_tokens
    full = cost_usd("gpt-4o-mini", trace.stats.prompt_tokens, trace.stats.completion_tokens)
    assert state.used_usd < full
