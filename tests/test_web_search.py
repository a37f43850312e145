"""web_search: SearXNG and Brave wire formats, normalised results, the tree's budget, the
provider's limits, domain filters, the analyst preset, and a real worker's explore branch."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
import yaml

from fleet.config.search import SearchConfig, SearchLimits
from fleet.config.webfilter import DomainFilter, DomainRules, host_of
from fleet.errors import ConfigError, ToolError
from fleet.limits.backends.memory.searches import MemorySearchCounter
from fleet.limits.backends.redis.limiter import Limiter
from fleet.limits.backends.redis.searches import RedisSearchCounter
from fleet.limits.searches import SearchCounter
from fleet.llm.config import load_config
from fleet.presets import BUILTIN_PRESETS, load_preset_file
from fleet.tools.websearch.service import SearchService
from tests.fake_search import FakeSearch, Hit, run_calls
from tests.fleetkit import celery_fleet

HITS = [
    Hit("asyncio &mdash; <b>docs</b>", "https://docs.python.org/3/library/asyncio.html", "x" * 900),
    Hit("Trio", "https://trio.readthedocs.io/", "structured <strong>concurrency</strong>"),
    Hit("Not a web page", "javascript:alert(1)", "dropped"),
]
LOOPBACK = {"FLEET_WEB_ALLOW": "127.0.0.1"}


@pytest.fixture
def searxng() -> Iterator[FakeSearch]:
    with FakeSearch("searxng", list(HITS)) as server:
        yield server


def searxng_config(server: FakeSearch, **extra: Any) -> dict[str, Any]:
    return {"search": {"provider": "searxng", "base_url": server.url, **extra}}


# --- the wire formats -------------------------------------------------------------------


def test_searxng_results_are_normalised_and_bounded(tmp_path: Path, searxng: FakeSearch) -> None:
    results, _, _ = run_calls(
        tmp_path, searxng_config(searxng), [("web_search", {"query": "asyncio"})], env=LOOPBACK
    )

    [result] = results
    assert not result.is_error, result.content
    assert "2 result(s) for 'asyncio'" in result.content
    assert "1. asyncio — docs\n   https://docs.python.org/3/library/asyncio.html" in result.content
    assert "x" * 499 + "…" in result.content and "x" * 501 not in result.content
    assert "structured concurrency" in result.content and "javascript:" not in result.content
    path, _ = searxng.requests[0]
    assert urlsplit(path).path == "/search"
    assert parse_qs(urlsplit(path).query) == {"q": ["asyncio"], "format": ["json"], "pageno": ["1"]}


def test_brave_sends_its_key_in_the_documented_header(tmp_path: Path) -> None:
    key = "BSAtestkey0123456789"
    config = {"search": {"provider": "brave", "api_key_env": "BRAVE_API_KEY"}}
    with FakeSearch("brave", list(HITS), key=key) as server:
        config["search"]["base_url"] = server.url
        results, _, _ = run_calls(
            tmp_path,
            config,
            [("web_search", {"query": "trio", "max_results": 1})],
            env={**LOOPBACK, "BRAVE_API_KEY": key},
        )
        path, headers = server.requests[0]

    assert not results[0].is_error, results[0].content
    assert "1 result(s)" in results[0].content and "asyncio — docs" in results[0].content
    assert headers["x-subscription-token"] == key
    assert parse_qs(urlsplit(path).query) == {"q": ["trio"], "count": ["1"]}


def test_max_results_is_bounded_and_a_bad_call_is_one_clear_line(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("web_search", {"query": "a", "max_results": 21}),
        ("web_search", {"query": ""}),
        ("web_search", {"query": "a", "domains": ["python.org/../x"]}),
        ("web_search", {"query": "a", "max_results": 1}),
    ]
    results, _, _ = run_calls(tmp_path, searxng_config(searxng), calls, env=LOOPBACK)

    assert [r.is_error for r in results] == [True, True, True, False]
    assert results[0].content == "max_results must be 1 to 20, not 21"
    assert "domain pattern 'python.org/../x'" in results[2].content
    assert "1 result(s)" in results[3].content
    assert len(searxng.requests) == 1, "refused calls never reach the provider"


def test_without_a_search_block_web_search_says_so(tmp_path: Path) -> None:
    results, _, _ = run_calls(tmp_path, {}, [("web_search", {"query": "a"})])
    assert results[0].is_error
    assert "web_search is not configured" in results[0].content


# --- budget and limits ------------------------------------------------------------------


def test_the_trees_search_budget_stops_the_third_search(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    config = searxng_config(searxng, max_searches_per_tree=2)
    calls = [("web_search", {"query": f"q{i}"}) for i in range(3)]

    results, _, _ = run_calls(tmp_path, config, calls, env=LOOPBACK)

    assert [r.is_error for r in results] == [False, False, True]
    assert "search budget is spent (2 searches" in results[2].content
    assert len(searxng.requests) == 2


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_search_counters_count_per_root(backend: str, request: pytest.FixtureRequest) -> None:
    counter: SearchCounter = (
        RedisSearchCounter(request.getfixturevalue("redis_client"))
        if backend == "redis"
        else MemorySearchCounter()
    )
    assert [counter.take("root-a", 2) for _ in range(3)] == [1, 2, None]
    assert counter.take("root-b", 2) == 1


@pytest.mark.integration
def test_the_providers_limits_refuse_at_once_rather_than_sleep(
    redis_client: redis.Redis, searxng: FakeSearch
) -> None:
    config = SearchConfig(
        provider="searxng", base_url=searxng.url, limits=SearchLimits(requests_per_minute=1)
    )
    service = SearchService(
        config,
        {},
        MemorySearchCounter(),
        limiter=Limiter(redis_client),
        web_allow=("127.0.0.1",),
    )

    def ask(query: str) -> int:
        return len(service.search(query, 5, trace_id="t1", root_trace_id="t1", timeout_s=5.0))

    assert ask("first") == 2
    with pytest.raises(ToolError, match=r"search provider is at its limits \(rate\): try again"):
        ask("second")
    assert len(searxng.requests) == 1


# --- config and presets -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ({"provider": "searxng"}, "provider searxng needs base_url"),
        ({"provider": "brave"}, "provider brave needs api_key_env"),
        ({"provider": "bing", "base_url": "https://x"}, "search.provider"),
        ({"provider": "brave", "api_key_env": "HOME"}, "api_key_env 'HOME' is not allowed"),
        ({"provider": "searxng", "base_url": "ftp://x"}, "must start with http"),
    ],
)
def test_a_bad_search_block_is_one_line_naming_it(
    tmp_path: Path, search: dict[str, Any], message: str
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"search": search}))
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path, env={})
    assert "\n" not in str(info.value)


def test_a_bad_domain_pattern_in_fleet_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"web": {"allow_domains": ["python.org:80"]}}))
    with pytest.raises(ConfigError, match=r"web.allow_domains.*domain pattern 'python.org:80'"):
        load_config(path, env={})


def test_the_analyst_preset_reads_and_searches_and_writes_nothing() -> None:
    analyst = BUILTIN_PRESETS["analyst"]
    # Memory is read only, and offered only to a tree bound to a namespace (docs/memory.md).
    reads = {"read_file", "read_image", "glob", "grep", "web_search", "web_fetch"}
    assert analyst.allowed_tools == frozenset(reads | {"memory_read", "memory_search"})
    assert (analyst.read_only, analyst.temperature, analyst.max_iterations) == (True, 0.3, 25)


def test_a_preset_file_sets_its_own_web_filter(tmp_path: Path) -> None:
    path = tmp_path / "docs.md"
    path.write_text(
        "---\nweb: {allow_domains: ['*.Python.org.'], deny_domains: [wiki.python.org]}\n---\nhi"
    )
    preset = load_preset_file(path)
    assert preset.web == DomainRules(allow=("*.python.org",), deny=("wiki.python.org",))


# --- the filter itself ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://docs.python.org/3/", False),
        ("https://DOCS.Python.ORG./3/", False),
        ("https://python.org/", True),  # `*.python.org` is the names under it, not itself
        ("https://evilpython.org/", True),
        ("https://docs.python.org.evil.example/", True),
        ("https://wiki.python.org/", True),  # denied
        ("https://WIKI.python.org./", True),
        ("https://ｗｉｋｉ.python.org/", True),  # full-width: the resolver maps it to ASCII
        ("https://docs.python.org@evil.example/", True),
        ("https:///no-host", True),
    ],
)
def test_domain_globs(url: str, refused: bool) -> None:
    rules = DomainRules(allow=("*.python.org",), deny=("wiki.python.org",))
    assert (DomainFilter((rules,)).refusal(url) is not None) is refused


def test_host_of_spells_hosts_as_the_resolver_does() -> None:
    assert host_of("http://ＰＹＴＨＯＮ.org./x") == "python.org"
    assert host_of("http://[::1]:80/") == "::1"


# --- a real worker ----------------------------------------------------------------------


def analyst_explore_script(path: Path) -> str:
    """A main agent exploring one analyst branch that fetches a denied URL, then searches."""
    search = {"name": "web_search", "arguments": {"query": "asyncio"}}
    fetch = {"name": "web_fetch", "arguments": {"url": "https://evil.example/grab"}}
    explore = {"name": "agent", "arguments": {"task": ["Find docs"], "agent_type": "analyst"}}
    steps = [{"tool_calls": [fetch]}, {"tool_calls": [search]}, {"content": "found: {last_tool}"}]
    branch = {"match": "^Find", "steps": steps}
    main = {"steps": [{"tool_calls": [explore]}, {"content": "answer: {last_tool}"}]}
    path.write_text(yaml.safe_dump({"scripts": [branch, main]}))
    return f"scripted:{path}"


@pytest.mark.integration
def test_an_analyst_branch_searches_on_a_real_worker(
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    searxng: FakeSearch,
) -> None:
    """Done when: on real workers an analyst branch of an explore calls web_search, the
    results reach the parent's answer; a result outside allow_domains is dropped; web_fetch
    of a denied domain is refused."""
    searxng.hits.append(Hit("Evil", "https://evil.example/asyncio", "click here"))
    config_path = tmp_path / "fleet.yaml"
    config = {**searxng_config(searxng), "web": {"allow_domains": ["*.python.org"]}}
    config_path.write_text(yaml.safe_dump(config))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.setenv("FLEET_CONFIG", str(config_path))
    monkeypatch.setenv("FLEET_WEB_ALLOW", "127.0.0.1")
    # The worker's only root is the workspace: a config beside it is the operator's.
    monkeypatch.setenv("FLEET_WORKSPACE_ROOTS", str(workspace))
    model = analyst_explore_script(tmp_path / "m.yaml")

    with celery_fleet(redis_url, workspace, monkeypatch) as fleet:
        trace = fleet.submit("research asyncio", model=model).wait(timeout_s=60)
        [branch] = fleet.store.collaborators(trace.trace_id)
        child = fleet.store.get_trace(branch.trace_id)
        fetched, searched = [m for m in fleet.store.messages(child.trace_id) if m.role == "tool"]

    assert trace.status == "completed", trace.error
    assert (child.mode, child.preset) == ("explore", "analyst")
    assert searched.name == "web_search" and not searched.metadata["is_error"]
    assert "2 outside the allowed domains dropped" in (searched.content or "")
    assert "https://docs.python.org/3/library/asyncio.html" in (searched.content or "")
    assert "evil.example" not in (searched.content or "")
    assert fetched.name == "web_fetch" and fetched.metadata["is_error"]
    assert "'evil.example' is refused: it is not in allow_domains" in (fetched.content or "")
    assert "answer: Explore finished: 1 branches, 1 completed" in (trace.answer or "")
    assert "https://docs.python.org/3/library/asyncio.html" in (trace.answer or "")
    assert "evil.example" not in (trace.answer or "")
    assert len(searxng.requests) == 1


# --- the worked example -----------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "analyst"


def test_the_analyst_example_needs_its_two_variables() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "BRAVE_API_KEY")}
    done = subprocess.run(
        ["sh", str(EXAMPLE / "run.sh")], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "set OPENAI_API_KEY" in done.stderr


def test_the_analyst_example_runs_inline_with_its_config(tmp_path: Path) -> None:
    """run.sh with a scripted model in place of OpenAI: its fleet.yaml loads (outside the
    workspace root), the analyst preset runs, web_search is offered to the model."""
    config = load_config(EXAMPLE / "fleet.yaml", env={})
    assert config.search is not None and config.search.provider == "brave"
    script = tmp_path / "answer.yaml"
    script.write_text(yaml.safe_dump({"scripts": [{"steps": [{"content": "recommend: anyio"}]}]}))
    fleet_bin = Path(sys.executable).parent / "fleet"
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-not-used-0000",
        "BRAVE_API_KEY": "BSA-not-used-0000",
        "FLEET_MODEL": f"scripted:{script}",
        "FLEET_ALLOW_SCRIPTED": "1",
        "FLEET": str(fleet_bin),
    }
    done = subprocess.run(
        ["sh", str(EXAMPLE / "run.sh"), "which async library?"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "recommend: anyio" in done.stdout
