"""Issue 26: web_search and the domain filters, attacked.

A result outside allow_domains, a redirect hop to a denied domain, a preset widening
fleet.yaml's allow list, a provider echoing the Brave key, a provider on loopback or the
metadata address, and huge, malformed or hostile provider answers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.inprocess import InProcessFleet
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import Script, ScriptedModel
from tests.fake_search import FakeSearch, Hit, Mode, run_calls
from tests.security.attacker import attacker_server, redis_text

PYTHON_DOCS = Hit("asyncio", "https://docs.python.org/3/library/asyncio.html", "event loop")
EVIL = Hit("Free tokens", "https://evil.example/grab", "click")
LOOPBACK = {"FLEET_WEB_ALLOW": "127.0.0.1"}


@pytest.fixture
def searxng() -> Iterator[FakeSearch]:
    with FakeSearch("searxng", [PYTHON_DOCS, EVIL]) as server:
        yield server


def config_for(server: FakeSearch, web: dict[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"search": {"provider": "searxng", "base_url": server.url}}
    if web is not None:
        config["web"] = web
    return config


def test_a_result_outside_allow_domains_is_dropped(tmp_path: Path, searxng: FakeSearch) -> None:
    """Route: a search result on an unlisted domain reached the model (and its next
    web_fetch). Control: every result URL passes the filter or is dropped."""
    searxng.hits += [
        Hit("spelled", "https://DOCS.python.org.evil.example/", "suffix trick"),
        Hit("userinfo", "https://docs.python.org@evil.example/", "userinfo trick"),
    ]
    config = config_for(searxng, {"allow_domains": ["*.python.org"]})

    [result], _, _ = run_calls(tmp_path, config, [("web_search", {"query": "q"})], env=LOOPBACK)

    assert not result.is_error, result.content
    assert "docs.python.org/3/library/asyncio.html" in result.content
    assert "evil.example" not in result.content
    assert "3 outside the allowed domains dropped" in result.content


def test_deny_domains_and_the_calls_own_domains_only_narrow(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    config = config_for(searxng, {"deny_domains": ["docs.python.org"]})
    calls: list[tuple[str, dict[str, Any]]] = [
        ("web_search", {"query": "q"}),
        ("web_search", {"query": "q", "domains": ["*.python.org"]}),
    ]

    results, _, _ = run_calls(tmp_path, config, calls, env=LOOPBACK)

    assert "evil.example/grab" in results[0].content
    assert "docs.python.org" not in results[0].content
    assert "0 result(s)" in results[1].content, "deny wins over the call's own domains"
    assert "site%3Apython.org" in searxng.requests[1][0]


def test_a_redirect_hop_to_a_denied_domain_is_refused(tmp_path: Path) -> None:
    """Route: an allowed page answered 302 to a denied domain and web_fetch followed it.
    Control: every hop passes the domain filter before it is requested."""
    with ExitStack() as stack:
        denied = stack.enter_context(attacker_server())
        start = stack.enter_context(attacker_server(host="127.0.0.2"))
        port = denied.url.rsplit(":", 1)[1]
        start.redirect_to = f"http://localhost:{port}/secret"
        config = {"web": {"deny_domains": ["localhost"]}}
        env = {"FLEET_WEB_ALLOW": "127.0.0.2,localhost,127.0.0.1,::1"}

        [result], _, _ = run_calls(
            tmp_path, config, [("web_fetch", {"url": f"{start.url}/start"})], env=env
        )

    assert len(start.requests) == 1
    assert denied.requests == [], "the denied hop was never requested"
    assert result.is_error
    assert "web_fetch refuses 'localhost' is refused: it matches deny_domains" in result.content


def test_web_fetch_of_a_domain_outside_allow_domains_never_connects(tmp_path: Path) -> None:
    with attacker_server() as target:
        config = {"web": {"allow_domains": ["*.python.org"]}}
        [result], _, _ = run_calls(
            tmp_path, config, [("web_fetch", {"url": f"{target.url}/x"})], env=LOOPBACK
        )
    assert result.is_error and "it is not in allow_domains" in result.content
    assert target.requests == []


def test_a_preset_cannot_widen_fleet_yamls_allow_list(tmp_path: Path, searxng: FakeSearch) -> None:
    """Route: a preset file lists `*` (or the attacker's domain) to undo the operator's
    allow list. Control: a preset's filter is one more layer; a URL must pass both."""
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "wide.md").write_text(
        "---\nweb: {allow_domains: ['*', evil.example]}\nread_only: true\n---\nGo anywhere."
    )
    config = config_for(searxng, {"allow_domains": ["*.python.org"]})
    calls = [("web_search", {"query": "q"}), ("web_fetch", {"url": "https://evil.example/grab"})]

    results, _, _ = run_calls(
        tmp_path, config, calls, env=LOOPBACK, preset="wide", agents_dir=agents
    )

    assert "evil.example" not in results[0].content
    assert "docs.python.org" in results[0].content
    assert results[1].is_error and "it is not in allow_domains" in results[1].content


@pytest.mark.integration
def test_the_brave_key_reaches_no_message_trace_log_or_error(
    tmp_path: Path, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Route: a provider answered an error quoting the X-Subscription-Token back, and the
    tool put the body in its error. Control: errors name the status only; every stored
    text is redacted besides."""
    key = "BSA" + "k3y" * 8
    with FakeSearch("brave", [PYTHON_DOCS], key=key, mode="echo_key") as server:
        config = {
            "search": {"provider": "brave", "api_key_env": "BRAVE_API_KEY", "base_url": server.url}
        }
        calls = [("web_search", {"query": "q"}), ("web_search", {"query": "q"})]
        with caplog.at_level(logging.DEBUG):
            results, local, trace_id = run_calls(
                tmp_path,
                config,
                calls,
                env={**LOOPBACK, "BRAVE_API_KEY": key},
                store=RedisStore(redis_client),
            )
        assert server.requests[0][1]["x-subscription-token"] == key  # it was sent, and echoed

    assert all(r.is_error for r in results)
    assert results[0].content == "search provider 'brave' answered HTTP 422"
    # The dump holds the trace, its messages and its event stream (the store is Redis).
    everything = redis_text(redis_client) + caplog.text
    assert local.store.get_trace(trace_id).status == "completed"
    assert key not in everything and key[3:15] not in everything
    assert "answered HTTP 422" in redis_text(redis_client)  # the dump did see the results


@pytest.mark.parametrize(
    ("base_url", "allow", "refused"),
    [
        ("http://169.254.169.254/", "", True),
        ("http://localhost:{port}/", "", True),
        ("http://127.0.0.1:{port}/", "", True),
        ("http://[::ffff:127.0.0.1]:{port}/", "", True),
        ("http://127.0.0.1:{port}/", "127.0.0.1", False),
    ],
)
def test_a_search_provider_on_an_internal_address_needs_fleet_web_allow(
    tmp_path: Path, searxng: FakeSearch, base_url: str, allow: str, refused: bool
) -> None:
    port = searxng.url.rsplit(":", 1)[1]
    config = {"search": {"provider": "searxng", "base_url": base_url.format(port=port)}}

    [result], _, _ = run_calls(
        tmp_path, config, [("web_search", {"query": "q"})], env={"FLEET_WEB_ALLOW": allow}
    )

    assert result.is_error is refused, result.content
    assert ("web_search refuses" in result.content) is refused
    assert len(searxng.requests) == (0 if refused else 1)


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("huge", "answered more than 1000000 bytes: refused"),
        ("malformed", "answered something that is not JSON"),
        ("nested", "answered something that is not JSON"),
        ("wrong_shape", "has no 'results' list"),
        ("throttle", "is overloaded (HTTP 429): try again in"),  # paused, as on a fleet
    ],
)
def test_a_hostile_provider_answer_is_bounded_and_one_clean_line(
    tmp_path: Path,
    searxng: FakeSearch,
    caplog: pytest.LogCaptureFixture,
    mode: Mode,
    message: str,
) -> None:
    searxng.mode = mode
    with caplog.at_level(logging.WARNING):
        [result], _, _ = run_calls(
            tmp_path, config_for(searxng), [("web_search", {"query": "q"})], env=LOOPBACK
        )
    assert result.is_error
    assert message in result.content and "\n" not in result.content
    assert "Traceback" not in caplog.text and "raised" not in caplog.text


def test_terminal_escapes_and_bidi_controls_in_results_are_removed(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    searxng.hits = [
        Hit(
            "\x1b]8;;https://evil.example\x07click\x1b]8;;\x07 \x1b[2J\u202eevil",
            "https://docs.python.org/\x1b[31m",
            "fine",
        ),
        Hit("\x1b[1mbold\x9b31m", "https://docs.python.org/ok", "\u200bsnip\x00pet\r\n"),
    ]
    [result], _, _ = run_calls(
        tmp_path, config_for(searxng), [("web_search", {"query": "q"})], env=LOOPBACK
    )
    assert not any(ch in result.content for ch in "\x1b\x07\x9b\u202e\u200b\x00\r")
    assert "https://docs.python.org/ok" in result.content
    assert "docs.python.org/\x1b" not in result.content, "a URL with escapes is dropped"


def test_a_query_cannot_carry_a_worker_secret_to_the_provider(
    tmp_path: Path, searxng: FakeSearch
) -> None:
    """Route: a model that read a secret searches for it, and the provider logs the query.
    Control: the worker's secret values are masked in every query before it is sent."""
    secret = "s3cr3t-" + "x9" * 10
    [result], _, _ = run_calls(
        tmp_path,
        config_for(searxng),
        [("web_search", {"query": f"what is {secret}"})],
        env={**LOOPBACK, "DEPLOY_TOKEN": secret},
    )
    assert not result.is_error, result.content
    [(path, _)] = searxng.requests
    assert secret not in path and "x9x9x9" not in path
    assert "redacted" in path


def test_an_explore_branch_stays_read_only_whatever_agent_type_names(tmp_path: Path) -> None:
    """Route: `agent(task=[...], agent_type="default")` to get writing branches now that
    explore honours agent_type. Control: explore is a read-only mode whatever the preset."""
    write = {"name": "write_file", "arguments": {"path": "owned.txt", "content": "x"}}
    explore = {"name": "agent", "arguments": {"task": ["write it"], "agent_type": "default"}}
    script = Script.parse(
        {
            "scripts": [
                {"match": "^write it", "steps": [{"tool_calls": [write]}, {"content": "tried"}]},
                {"steps": [{"tool_calls": [explore]}, {"content": "done"}]},
            ]
        },
        "test",
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings.from_env({"FLEET_WORKSPACE": str(workspace)})
    model = ScriptedModel(function=script.respond)
    local = InProcessFleet.from_settings(settings, clients={"m": model})

    trace = local.run("go", model="m")

    [child] = local.store.collaborators(trace.trace_id)
    [refusal] = [m for m in local.store.messages(child.trace_id) if m.role == "tool"]
    assert local.store.get_trace(child.trace_id).preset == "default"
    assert "is read-only" in (refusal.content or ""), refusal.content
    assert not (workspace / "owned.txt").exists()
