"""Issue 26's rest: web_search answers cached where the preset allows it, and a child's web
domain filter is its own preset's narrowed by its parent's (never wider)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.children.subagents import child_ceiling
from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.models import Trace, text_of
from fleet.presets import load_preset_file
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.caches import search_answers
from fleet.testing import ScriptedModel, call, calls, text
from fleet.tools.websearch.cache import SearchCache
from fleet.tools.websearch.results import SearchResult
from tests.fake_search import FakeSearch, Hit, run_calls

HITS = [
    Hit("asyncio docs", "https://docs.python.org/3/library/asyncio.html", "event loop"),
    Hit("Trio", "https://trio.readthedocs.io/", "structured concurrency"),
]
LOOPBACK = {"FLEET_WEB_ALLOW": "127.0.0.1"}
CACHING = "---\nname: researcher\ntools: [web_search]\ncache: {ttl_s: 600, tools: [web_search]}\n---\nSearch."  # noqa: E501


@pytest.fixture
def searxng() -> Iterator[FakeSearch]:
    with FakeSearch("searxng", list(HITS)) as server:
        yield server


def agents(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "agents"
    folder.mkdir(exist_ok=True)
    for name, body in files.items():
        (folder / f"{name}.md").write_text(body)
    return folder


def config(server: FakeSearch, **search: Any) -> dict[str, Any]:
    return {"search": {"provider": "searxng", "base_url": server.url, **search}}


# -- the cache -----------------------------------------------------------------------------


def test_a_caching_preset_asks_the_provider_once_for_the_same_search(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    folder = agents(tmp_path, researcher=CACHING)
    same = [("web_search", {"query": "asyncio"})] * 2  # a third would be a doom loop
    results, local, _ = run_calls(
        tmp_path, config(searxng), same, env=LOOPBACK, preset="researcher", agents_dir=folder
    )
    assert [r.is_error for r in results] == [False] * 2
    assert len({r.content for r in results}) == 1
    assert len(searxng.requests) == 1  # the 2nd was answered from the cache
    other = [("web_search", {"query": "trio"})]
    run_calls(
        tmp_path,
        config(searxng),
        other + same,
        env=LOOPBACK,
        preset="researcher",
        agents_dir=folder,
        store=local.store,  # the same store: the cache is the fleet's, not the trace's
    )
    assert len(searxng.requests) == 2  # another query is another entry; asyncio was a hit


def test_without_the_preset_saying_so_nothing_is_cached(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    same = [("web_search", {"query": "asyncio"})] * 2
    results, _, _ = run_calls(tmp_path, config(searxng), same, env=LOOPBACK)
    assert [r.is_error for r in results] == [False, False]
    assert len(searxng.requests) == 2


def test_a_cache_hit_spends_no_search_budget(tmp_path: Path, searxng: FakeSearch) -> None:
    folder = agents(tmp_path, researcher=CACHING)
    same = [("web_search", {"query": "asyncio"})] * 2
    results, _, _ = run_calls(
        tmp_path,
        config(searxng, max_searches_per_tree=1),
        same,
        env=LOOPBACK,
        preset="researcher",
        agents_dir=folder,
    )
    assert [r.is_error for r in results] == [False] * 2


def test_a_hit_is_filtered_by_the_asking_traces_own_domains(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    folder = agents(tmp_path, researcher=CACHING)
    config_ = {**config(searxng), "web": {"allow_domains": ["*.python.org"]}}
    same = [("web_search", {"query": "asyncio"})] * 2
    results, _, _ = run_calls(
        tmp_path, config_, same, env=LOOPBACK, preset="researcher", agents_dir=folder
    )
    for result in results:
        assert "docs.python.org" in result.content and "trio" not in result.content.lower()


def test_a_forged_cache_entry_is_cleaned_as_it_is_read() -> None:
    """Attack: an entry in Redis holding terminal escapes and a javascript: URL."""
    store = MemoryStore()
    cache = SearchCache(search_answers(store), 60, "searxng")
    forged = [
        [
            "\x1b]8;;https://evil.example\x07click\x1b[2J\u202eevil",
            "https://docs.python.org/",
            "ok",
        ],
        ["bad", "javascript:alert(1)", "x"],
        "not a row",
    ]
    store.cache_set(keys.search_cache(cache.digest("q", 5)), json.dumps(forged), 60)
    found = cache.get("q", 5)
    assert found is not None and len(found) == 1
    assert not any(ch in found[0].title for ch in "\x1b\x07\u202e")
    store.cache_set(keys.search_cache(cache.digest("q", 5)), "{not json", 60)
    assert cache.get("q", 5) is None
    cache.put("q", 5, [SearchResult("t", "https://a.example/", "s")])
    assert cache.get("q", 5) == [SearchResult("t", "https://a.example/", "s")]


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ("{ttl_s: 60}", "cache needs keys"),
        ("{ttl_s: 60, tools: [bash]}", "cache.tools"),
    ],
)
def test_a_cache_section_must_say_what_it_caches(tmp_path: Path, cache: str, message: str) -> None:
    path = tmp_path / "p.md"
    path.write_text(f"---\nname: p\ncache: {cache}\n---\nx")
    with pytest.raises(ConfigError, match=message) as raised:
        load_preset_file(path)
    assert "\n" not in str(raised.value)


# -- a child's domain ceiling -------------------------------------------------------------

NARROW = "---\nname: narrow\nweb: {allow_domains: ['*.python.org']}\n---\nOnly Python."
WIDE_ANALYST = "---\nname: wide\ntools: [web_search]\nread_only: true\n---\nSearch anything."


def fleet_with(tmp_path: Path, server: FakeSearch, model: ScriptedModel) -> InProcessFleet:
    (workspace := tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(config(server)))
    folder = agents(tmp_path, narrow=NARROW, wide=WIDE_ANALYST)
    env = {
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_CONFIG": str(tmp_path / "fleet.yaml"),
        "FLEET_AGENTS_DIR": str(folder),
        **LOOPBACK,
    }
    return InProcessFleet.from_settings(Settings.from_env(env), clients={"m": model})


def test_a_child_inherits_its_parents_domain_filter_as_a_ceiling(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    local = fleet_with(tmp_path, searxng, ScriptedModel([text("x")]))
    runtime = local.runtime
    parent = Trace(trace_id="t-parent", root_trace_id="t-parent", task="t", preset="narrow")
    ceiling = child_ceiling(runtime, parent)
    child = Trace(
        trace_id="t-parent@delegate-1",
        root_trace_id="t-parent",
        parent_trace_id="t-parent",
        mode="delegate",
        task="t",
        preset="wide",
        ceiling=ceiling,
    )
    assert runtime.web_filter(child).refusal("https://trio.readthedocs.io/") is not None
    assert runtime.web_filter(child).refusal("https://docs.python.org/3/") is None
    alone = child.model_copy(update={"ceiling": ceiling.model_copy(update={"web": []})})
    assert runtime.web_filter(alone).refusal("https://trio.readthedocs.io/") is None  # control
    grandchild = child.model_copy(update={"ceiling": child_ceiling(runtime, child)})
    assert grandchild.ceiling.web == ceiling.web  # passed on, not piled up
    assert runtime.web_filter(grandchild).refusal("https://trio.readthedocs.io/") is not None


def test_a_delegate_with_a_wider_preset_cannot_search_past_its_parent(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    """Attack: a parent limited to *.python.org delegates to a preset that allows any domain."""
    model = ScriptedModel(
        [
            call("agent", task="search for me", agent_type="wide"),
            calls(("web_search", {"query": "concurrency"})),
            text("child done"),
            text("parent done"),
        ]
    )
    local = fleet_with(tmp_path, searxng, model)
    trace = local.run("research", model="m", preset="narrow")
    assert trace.status == "completed", trace.error
    (child_id,) = local.store.children(trace.trace_id)
    searched = [m for m in local.store.messages(child_id) if m.name == "web_search"]
    (result,) = searched
    content = text_of(result.content)
    assert "docs.python.org" in content
    assert "trio.readthedocs.io" not in content and "1 outside the allowed domains" in content
