"""`fleet mcp`: the SDK's own client drives the fleet over stdio (and HTTP) against a real
worker process; nothing but the MCP protocol between the client and the fleet."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
import yaml
from mcp import ClientSession, StdioServerParameters, stdio_client

from fleet.storage.backends.redis.connect import connect
from fleet.storage.backends.redis.store import RedisStore
from tests.procs import start_worker, wait_for_workers
from tests.test_fleet_recovery import database_url

pytestmark = pytest.mark.integration

SERVE_DB = 10
TIMEOUT_S = 60.0
TOKEN = "a-long-enough-test-token"


def script(latency_ms: int = 0) -> dict[str, Any]:
    look = {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}
    ask = {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which one?"}}]}
    slow = [f"Slow branch {i}" for i in range(3)]
    # other paths each time: the same call three times in a row would end it as a doom loop
    wander = [
        {"tool_calls": [{"name": "list_dir", "arguments": {"path": "." + "/." * i}}]}
        for i in range(9)
    ]
    spawn = {"tool_calls": [{"name": "agent", "arguments": {"task": slow}}]}
    return {
        "scripts": [
            {"match": "^Survey", "steps": [look, {"content": "done: {task}"}]},
            {"match": "^Slow branch", "steps": [look, look, {"content": "late"}]},
            {"match": "^Long branch", "steps": [*wander, {"content": "too late"}]},
            {"match": "^Tree", "steps": [spawn, {"content": "{last_tool}"}]},
            {"match": "^Ask", "steps": [ask, {"content": "told: {last_tool}"}]},
        ],
        "latency_ms": latency_ms,
    }  # fmt: skip


@dataclass
class Served:
    env: dict[str, str]
    slow_model: str
    """Every model call takes a second: a tree on it runs long enough to be stopped."""


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    url = database_url(redis_url, SERVE_DB)
    workspace = tmp_path_factory.mktemp("workspace")
    operator = tmp_path_factory.mktemp("operator")
    model_file, slow_file = operator / "script.yaml", operator / "slow.yaml"
    model_file.write_text(yaml.safe_dump(script()))
    slow_file.write_text(yaml.safe_dump(script(latency_ms=1000)))
    env = {
        "FLEET_REDIS_URL": url,
        "FLEET_BROKER_URL": url,
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),
        "FLEET_ALLOW_SCRIPTED": "1",
        "FLEET_MODEL": f"scripted:{model_file}",
    }
    with start_worker(url, concurrency=8, env_extra=env) as worker:
        wait_for_workers(url, [worker.name], timeout_s=60)
        yield Served(env, f"scripted:{slow_file}")


def with_client(served: Served, body: Callable[[ClientSession], Awaitable[Any]]) -> Any:
    """Start `fleet mcp` as the SDK starts any stdio server, run `body` with a session."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "fleetops.cli.main", "mcp"], env=served.env
    )

    async def session() -> Any:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                return await body(client)

    return anyio.run(session)


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_the_client_lists_the_fleet_tools(served: Served) -> None:
    async def body(client: ClientSession) -> list[str]:
        return [tool.name for tool in (await client.list_tools()).tools]

    names = with_client(served, body)
    assert set(names) == {
        "submit", "explore", "delegate", "trace", "wait", "stop", "reply", "send"
    }  # fmt: skip


def test_explore_five_tasks_gives_five_results_with_progress(served: Served) -> None:
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async def body(client: ClientSession) -> Any:
        tasks = [f"Survey part {i}" for i in range(1, 6)]
        arguments: dict[str, Any] = {"tasks": tasks, "timeout_s": TIMEOUT_S}
        return await client.call_tool("explore", arguments, progress_callback=on_progress)

    tree = structured(with_client(served, body))
    results = tree["results"]

    assert [r["status"] for r in results] == ["completed"] * 5
    assert [r["answer"] for r in results] == [f"done: Survey part {i}" for i in range(1, 6)]
    assert sorted(seen) == [(float(i), 5.0) for i in range(1, 6)]
    # one tree: a root whose five collaborators are the branches, each a child of it
    root = tree["trace_id"]
    assert tree["status"] == "completed" and "@" not in root
    assert [c["trace_id"] for c in tree["collaborators"]] == [r["trace_id"] for r in results]
    assert all(r["trace_id"].startswith(f"{root}@explore-") for r in results)
    for i in range(1, 6):
        assert f"done: Survey part {i}" in tree["answer"]


def test_stop_stops_an_explore_tree_and_every_branch(served: Served) -> None:
    async def body(client: ClientSession) -> tuple[dict[str, Any], dict[str, Any]]:
        tasks = [f"Long branch {i}" for i in range(5)]  # 10 calls of a second each
        arguments = {"tasks": tasks, "model": served.slow_model, "timeout_s": 1.5}
        running = structured(await client.call_tool("explore", arguments))
        stopped = structured(await client.call_tool("stop", {"trace_id": running["trace_id"]}))
        assert len(stopped["stopped"]) >= 1
        ended = structured(await client.call_tool("wait", {"trace_id": running["trace_id"]}))
        for _ in range(200):  # running branches stop themselves at their next turn
            if all(c["status"] != "running" for c in ended["collaborators"]):
                break
            await anyio.sleep(0.05)
            ended = structured(await client.call_tool("trace", {"trace_id": running["trace_id"]}))
        return running, ended

    running, ended = with_client(served, body)
    assert running["status"] in ("running", "waiting")  # the explore gave up waiting first
    assert len(running["results"]) == 5
    assert ended["status"] == "stopped"
    assert [c["status"] for c in ended["collaborators"]] == ["stopped"] * 5


def test_submit_trace_and_wait(served: Served) -> None:
    async def body(client: ClientSession) -> tuple[Any, Any]:
        submitted = structured(await client.call_tool("submit", {"task": "Survey alone"}))
        done = await client.call_tool("wait", {"trace_id": submitted["trace_id"]})
        shown = await client.call_tool("trace", {"trace_id": submitted["trace_id"]})
        return structured(done), structured(shown)

    done, shown = with_client(served, body)
    assert done["status"] == "completed" and done["answer"] == "done: Survey alone"
    assert shown == done


def test_submit_binds_memory_and_refuses_a_malformed_namespace(served: Served) -> None:
    async def body(client: ClientSession) -> tuple[Any, Any]:
        bound = {"task": "Survey alone", "memory": ["user:alice"]}
        submitted = structured(await client.call_tool("submit", bound))
        bad = await client.call_tool("submit", {"task": "x", "memory": ["alice\nIgnore"]})
        return submitted["trace_id"], bad

    trace_id, bad = with_client(served, body)
    store = RedisStore(connect(served.env["FLEET_REDIS_URL"]))
    assert store.get_trace(trace_id).memory == ["user:alice"]
    assert bad.is_error and "namespace" in bad.content[0].text
    assert "\n" not in bad.content[0].text


def test_stop_stops_a_running_tree(served: Served) -> None:
    async def body(client: ClientSession) -> dict[str, Any]:
        submit = {"task": "Tree", "model": served.slow_model}
        trace_id = structured(await client.call_tool("submit", submit))["trace_id"]
        for _ in range(600):  # until its branches run (observable through `trace`)
            shown = structured(await client.call_tool("trace", {"trace_id": trace_id}))
            if len(shown["collaborators"]) == 3:
                break
            await anyio.sleep(0.05)
        stopped = structured(await client.call_tool("stop", {"trace_id": trace_id}))
        assert len(stopped["stopped"]) == 4
        ended = structured(await client.call_tool("wait", {"trace_id": trace_id}))
        for _ in range(200):  # running branches stop themselves at their next turn
            if all(c["status"] != "running" for c in ended["collaborators"]):
                break
            await anyio.sleep(0.05)
            ended = structured(await client.call_tool("trace", {"trace_id": trace_id}))
        return ended

    ended = with_client(served, body)
    assert ended["status"] == "stopped"
    assert [c["status"] for c in ended["collaborators"]] == ["stopped"] * 3


def test_reply_answers_a_waiting_trace(served: Served) -> None:
    async def body(client: ClientSession) -> dict[str, Any]:
        trace_id = structured(await client.call_tool("submit", {"task": "Ask me"}))["trace_id"]
        waiting = structured(await client.call_tool("wait", {"trace_id": trace_id}))
        assert waiting["status"] == "waiting"
        await client.call_tool("reply", {"trace_id": trace_id, "answer": "the blue one"})
        return structured(await client.call_tool("wait", {"trace_id": trace_id}))

    ended = with_client(served, body)
    assert ended["status"] == "completed" and ended["answer"] == "told: the blue one"


def test_send_reaches_a_waiting_trace_and_refuses_an_ended_one(served: Served) -> None:
    async def body(client: ClientSession) -> tuple[dict[str, Any], Any]:
        trace_id = structured(await client.call_tool("submit", {"task": "Ask me"}))["trace_id"]
        waiting = structured(await client.call_tool("wait", {"trace_id": trace_id}))
        assert waiting["status"] == "waiting"
        sent = structured(
            await client.call_tool("send", {"trace_id": trace_id, "text": "use the blue one"})
        )
        await client.call_tool("reply", {"trace_id": trace_id, "answer": "blue"})
        await client.call_tool("wait", {"trace_id": trace_id})
        late = await client.call_tool("send", {"trace_id": trace_id, "text": "too late"})
        return sent, late

    sent, late = with_client(served, body)
    assert sent["entry_id"]
    assert late.is_error and "has ended" in late.content[0].text
    assert "\n" not in late.content[0].text


def test_a_bad_call_is_a_clear_tool_error(served: Served) -> None:
    async def body(client: ClientSession) -> list[Any]:
        return [
            await client.call_tool("submit", {"task": "x", "preset": "nope"}),
            await client.call_tool("trace", {"trace_id": "no-such-trace"}),
            await client.call_tool("explore", {"tasks": []}),
        ]

    results = with_client(served, body)
    for result in results:
        assert result.is_error
        (content,) = result.content
        assert "\n" not in content.text and "Traceback" not in content.text
    assert "unknown preset 'nope'" in results[0].content[0].text
    assert "give between 1 and" in results[2].content[0].text


def test_a_client_cannot_name_a_workspace_outside_the_roots(served: Served) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("submit", {"task": "Survey /etc"}),
        ("delegate", {"task": "Survey /etc"}),
        ("explore", {"tasks": ["Survey /etc"]}),
    ]

    async def body(client: ClientSession) -> list[Any]:
        return [
            await client.call_tool(tool, {**arguments, "workspace": "/etc"})
            for tool, arguments in calls
        ]

    for result in with_client(served, body):
        assert result.is_error, result.content
        assert "FLEET_WORKSPACE_ROOTS" in result.content[0].text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _first_post(url: str, body: dict[str, object], headers: dict[str, str]) -> httpx.Response:
    """The first request, once the server listens (its ready line may come just before)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return httpx.post(url, json=body, headers=headers, timeout=10)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_http_needs_the_bearer_token_when_one_is_set(served: Served) -> None:
    port = free_port()
    env = {**os.environ, **served.env, "FLEET_SERVE_TOKEN": TOKEN}
    argv = [sys.executable, "-m", "fleetops.cli.main", "mcp", "--http", str(port)]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert process.stdout is not None
        assert b"fleet mcp: http://127.0.0.1" in process.stdout.readline()
        url = f"http://127.0.0.1:{port}/mcp"
        hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        accept = {"Accept": "application/json, text/event-stream"}
        refused = _first_post(url, hello, accept)
        wrong = httpx.post(url, json=hello, headers={**accept, "Authorization": "Bearer no"})
        assert refused.status_code == wrong.status_code == 401
        allowed = httpx.post(
            url, json=hello, headers={**accept, "Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
        assert allowed.status_code != 401
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def test_http_beyond_loopback_without_a_token_is_refused(served: Served) -> None:
    env = {k: v for k, v in {**os.environ, **served.env}.items() if k != "FLEET_SERVE_TOKEN"}
    argv = [sys.executable, "-m", "fleetops.cli.main", "mcp", "--http", "8999"]
    argv += ["--address", "0.0.0.0"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)

    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "set FLEET_SERVE_TOKEN" in done.stderr
