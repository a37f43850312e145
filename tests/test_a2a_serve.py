"""The fleet as an A2A agent: a2a-sdk's client against `fleet a2a`'s app on a real worker.

The Done-when rows of issue 43's second part: a message completes with the tree's answer
as its artifact; streaming shows working then completed; CancelTask stops the tree; an
`ask_human` round trip goes through input-required; the endpoint refuses a request
without the card's bearer token; `fleet a2a` without a token does not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb

from fleet.client import Fleet
from fleetops.a2a.app import build_app
from tests.a2a_agent import free_port
from tests.fleetkit import client, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
TOKEN = "a2a-token-0123456789"


@dataclass
class Served:
    fleet: Fleet
    url: str
    env: dict[str, str]


def write_scripts(folder: Path) -> tuple[str, str]:
    main = {
        "scripts": [
            {
                "match": "^ask",
                "steps": [
                    {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which?"}}]},
                    {"content": "you said: {last_tool}"},
                ],
            },
            {"match": ".*", "steps": [{"content": "the tree's answer to: {last_user}"}]},
        ]
    }
    slow = {"latency_ms": 60_000, "scripts": [{"match": ".*", "steps": [{"content": "late"}]}]}
    (folder / "main.yaml").write_text(yaml.safe_dump(main))
    (folder / "slow.yaml").write_text(yaml.safe_dump(slow))
    return f"scripted:{folder / 'main.yaml'}", f"scripted:{folder / 'slow.yaml'}"


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tests.conftest import flush

    flush(redis_url)
    conf = tmp_path_factory.mktemp("conf")
    workspace = tmp_path_factory.mktemp("ws")
    main, slow = write_scripts(conf)
    agents = conf / "agents"
    agents.mkdir()
    (agents / "helper.md").write_text(
        "---\nname: helper\ndescription: helps\na2a: true\n---\nHelp.\n"
    )
    (agents / "slowpoke.md").write_text(f"---\nname: slowpoke\nmodel: {slow}\na2a: true\n---\nS\n")
    env = {
        "FLEET_ALLOW_SCRIPTED": "1",
        "FLEET_MODEL": main,
        "FLEET_AGENTS_DIR": str(agents),
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),
    }
    with contextlib.ExitStack() as stack:
        worker = stack.enter_context(start_worker(redis_url, concurrency=2, env_extra=env))
        wait_for_workers(redis_url, [worker.name], timeout_s=30)
        fleet = client(fleet_settings(redis_url, workspace, **env))
        with serving(fleet) as url:
            yield Served(fleet, url, {**env, "FLEET_REDIS_URL": redis_url})


@contextlib.contextmanager
def fleet_a2a(env: dict[str, str], log: Path) -> Iterator[str]:
    """The real `fleet a2a` command, SIGKILLed when the block ends (nothing is flushed)."""
    port = free_port()
    with log.open("ab") as out:
        served = subprocess.Popen(
            [sys.executable, "-m", "fleetops.cli.main", "a2a", "--port", str(port)],
            env={**os.environ, **env, "FLEET_SERVE_TOKEN": TOKEN},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until(lambda: listening(url) or served.poll() is not None, 60, "fleet a2a")
        assert served.poll() is None, log.read_text()
        yield url
    finally:
        served.kill()
        served.wait(10)


def listening(url: str) -> bool:
    try:
        return httpx.get(url + ".well-known/agent-card.json", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def serving(fleet: Fleet) -> Iterator[str]:
    """`fleet a2a`'s app on a loopback port, on its own thread, until the block ends."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    app = build_app(fleet, url, TOKEN, poll_s=0.1)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "fleet a2a listening")
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


async def a2a_call(url: str, act: Any, *, streaming: bool = False, token: str = TOKEN) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        config = ClientConfig(streaming=streaming, httpx_client=http)
        return await act(ClientFactory(config).create(card))


def message(text: str, **ids: str) -> pb.SendMessageRequest:
    msg = pb.Message(message_id=uuid.uuid4().hex, role=pb.ROLE_USER, parts=[pb.Part(text=text)])
    for name, value in ids.items():
        setattr(msg, name, value)
    return pb.SendMessageRequest(message=msg)


async def last_task(client: Any, request: pb.SendMessageRequest) -> pb.Task:
    task: pb.Task | None = None
    async for event in client.send_message(request):
        if event.HasField("task"):
            task = event.task
    assert task is not None
    return task


def test_the_card_names_the_a2a_presets_and_the_bearer_scheme(served: Served) -> None:
    card = httpx.get(served.url + ".well-known/agent-card.json", timeout=10).json()
    assert sorted(s["id"] for s in card["skills"]) == ["helper", "slowpoke"]
    scheme = card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]
    assert scheme["scheme"] == "Bearer"


@pytest.mark.parametrize("token", ["", "wrong-token-0123456789"])
def test_the_endpoint_refuses_a_request_without_the_token(served: Served, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"jsonrpc": "2.0", "id": "1", "method": "GetTask", "params": {"id": "x"}}
    answer = httpx.post(served.url, json=body, headers=headers, timeout=10)
    assert answer.status_code == 401
    text = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "x"}]}
    send: dict[str, Any] = {"jsonrpc": "2.0", "id": "2", "method": "SendMessage"}
    send["params"] = {"message": text}
    before = len(served.fleet.store.list_traces(1000))
    assert httpx.post(served.url, json=send, headers=headers, timeout=10).status_code == 401
    assert len(served.fleet.store.list_traces(1000)) == before  # no tree was started


def test_a_huge_or_undeclared_body_is_refused_before_it_is_read(served: Served) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    huge = b'{"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {"x": "'
    huge += b"x" * 2_000_000 + b'"}}'
    assert httpx.post(served.url, content=huge, headers=headers, timeout=10).status_code == 413

    def chunks() -> Iterator[bytes]:
        yield b'{"jsonrpc": "2.0", "id": "1", "method": "GetTask", "params": {"id": "x"}}'

    chunked = httpx.post(served.url, content=chunks(), headers=headers, timeout=10)
    assert chunked.status_code == 413


def test_a_message_completes_with_the_trees_answer_as_its_artifact(served: Served) -> None:
    task = asyncio.run(a2a_call(served.url, lambda c: last_task(c, message("count the files"))))
    assert task.status.state == pb.TASK_STATE_COMPLETED
    (artifact,) = task.artifacts
    assert artifact.parts[0].text == "the tree's answer to: count the files"


def test_a_message_in_the_same_context_continues_the_tree(served: Served) -> None:
    async def twice(client: Any) -> tuple[pb.Task, pb.Task]:
        first = await last_task(client, message("first question"))
        again = await last_task(client, message("second question", context_id=first.context_id))
        return first, again

    first, again = asyncio.run(a2a_call(served.url, twice))
    assert again.status.state == pb.TASK_STATE_COMPLETED and again.id != first.id
    assert again.artifacts[0].parts[0].text == "the tree's answer to: second question"
    root = str(again.artifacts[0].metadata["trace_id"])
    assert root == str(first.artifacts[0].metadata["trace_id"])
    users = [m.content for m in served.fleet.store.messages(root) if m.role == "user"]
    assert users == ["first question", "second question"]  # one tree, two turns


def test_streaming_shows_working_then_completed(served: Served) -> None:
    async def stream(client: Any) -> list[int]:
        states = []
        async for event in client.send_message(message("stream it")):
            if event.HasField("status_update"):
                states.append(event.status_update.status.state)
            if event.HasField("task"):
                states.append(event.task.status.state)
        return states

    states = asyncio.run(a2a_call(served.url, stream, streaming=True))
    assert pb.TASK_STATE_WORKING in states and states[-1] == pb.TASK_STATE_COMPLETED
    assert states.index(pb.TASK_STATE_WORKING) < len(states) - 1


def test_cancel_task_stops_the_tree(served: Served) -> None:
    async def start_and_cancel(client: Any) -> tuple[pb.Task, pb.Task]:
        request = message("take your time")
        request.metadata["skill"] = "slowpoke"
        request.configuration.return_immediately = True
        task = await last_task(client, request)
        for _ in range(100):
            task = await client.get_task(pb.GetTaskRequest(id=task.id))
            if task.status.state == pb.TASK_STATE_WORKING:
                break
            await asyncio.sleep(0.1)
        return task, await client.cancel_task(pb.CancelTaskRequest(id=task.id))

    working, canceled = asyncio.run(a2a_call(served.url, start_and_cancel))
    assert canceled.status.state == pb.TASK_STATE_CANCELED
    root = working.status.message.parts[0].text.removeprefix("fleet trace ")
    wait_until(lambda: served.fleet.trace(root).status == "stopped", 30, "the tree stopped")


def test_ask_human_round_trip_through_input_required(served: Served) -> None:
    async def ask_and_answer(client: Any) -> tuple[pb.Task, pb.Task]:
        asked = await last_task(client, message("ask me"))
        reply = message("the blue one", task_id=asked.id, context_id=asked.context_id)
        return asked, await last_task(client, reply)

    asked, answered = asyncio.run(a2a_call(served.url, ask_and_answer))
    assert asked.status.state == pb.TASK_STATE_INPUT_REQUIRED
    assert asked.status.message.parts[0].text == "Which?"
    assert answered.status.state == pb.TASK_STATE_COMPLETED
    assert answered.artifacts[0].parts[0].text == "you said: the blue one"


def test_a_restarted_fleet_a2a_answers_get_and_cancel_of_earlier_tasks(
    served: Served, tmp_path: Path
) -> None:
    async def start_three(client: Any) -> list[pb.Task]:
        requests = [message("ask me later"), message("ask me meanwhile")]
        requests.append(message("take your time again"))
        requests[-1].metadata["skill"] = "slowpoke"
        for request in requests:
            request.configuration.return_immediately = True
        return [await last_task(client, r) for r in requests]

    async def state_of(url: str, task_id: str) -> int:
        got = await a2a_call(url, lambda c: c.get_task(pb.GetTaskRequest(id=task_id)))
        return int(got.status.state)

    log = tmp_path / "a2a.log"
    with fleet_a2a(served.env, log) as first:  # the first `fleet a2a`, SIGKILLed after
        asking, meanwhile, slow = asyncio.run(a2a_call(first, start_three))
        asked, working = pb.TASK_STATE_INPUT_REQUIRED, pb.TASK_STATE_WORKING
        for task_id, state in ((asking.id, asked), (meanwhile.id, asked), (slow.id, working)):
            reached = lambda t=task_id, s=state: asyncio.run(state_of(first, t)) == s  # noqa: E731
            wait_until(reached, 60, "task state")
        root = [t for t in served.fleet.store.list_traces(200) if t.task == "ask me meanwhile"]
    served.fleet.reply(root[0].trace_id, "answered while no fleet a2a ran")
    wait_until(lambda: served.fleet.trace(root[0].trace_id).status == "completed", 60, "tree")

    async def after_restart(client: Any) -> list[pb.Task]:
        done = await client.get_task(pb.GetTaskRequest(id=meanwhile.id))
        asked = await client.get_task(pb.GetTaskRequest(id=asking.id))
        reply = message("the red one", task_id=asking.id, context_id=asking.context_id)
        answered = await last_task(client, reply)
        canceled = await client.cancel_task(pb.CancelTaskRequest(id=slow.id))
        return [done, asked, answered, canceled]

    with fleet_a2a(served.env, log) as second:  # a new process: nothing in its memory
        done, asked, answered, canceled = asyncio.run(a2a_call(second, after_restart))
        got = asyncio.run(a2a_call(second, lambda c: c.get_task(pb.GetTaskRequest(id=slow.id))))
    assert done.status.state == pb.TASK_STATE_COMPLETED  # the tree ended while none ran
    assert done.artifacts[0].parts[0].text == "you said: answered while no fleet a2a ran"
    assert asked.status.state == pb.TASK_STATE_INPUT_REQUIRED
    assert asked.status.message.parts[0].text == "Which?"
    assert answered.status.state == pb.TASK_STATE_COMPLETED
    assert answered.artifacts[0].parts[0].text == "you said: the red one"
    assert canceled.status.state == pb.TASK_STATE_CANCELED
    assert got.status.state == pb.TASK_STATE_CANCELED

    def statuses() -> list[str]:
        traces = served.fleet.store.list_traces(200)
        return [t.status for t in traces if t.task == "take your time again"]

    # CancelTask stopped the tree: a running trace ends `stopped` at its worker's next look
    wait_until(lambda: statuses() == ["stopped"], 30, "the cancelled task's tree stopped")


def test_fleet_a2a_does_not_start_without_a_token(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLEET_SERVE_TOKEN"}
    env["FLEET_REDIS_URL"] = redis_url
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "a2a", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and time.monotonic() - started < 60
    assert "fleet a2a needs FLEET_SERVE_TOKEN" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_every_key_fleet_a2a_keeps_lives_the_retention(redis_url: str) -> None:
    import redis

    from fleet.storage import keys
    from fleet.storage.backends.redis.a2a_tasks import RedisA2ATasks

    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    tasks = RedisA2ATasks(raw)
    tasks.save("t-" + "x" * 5000, "{}", 1_000_000, 60)  # any id: hashed into the key
    tasks.link("context", "{odd}id", "root-1", 60)
    names = [keys.a2a_task("t-" + "x" * 5000), keys.a2a_link("context", "{odd}id")]
    names.append(keys.a2a_recent())
    assert all(0 < raw.ttl(name) <= 60 for name in names)
    assert all(len(name) < 80 for name in names)
    assert tasks.root_of("context", "{odd}id") == "root-1"
    tasks.save("t-2", "{}", 1_000_000 + 61_000, 60)  # a minute later: the first left the list
    kept = raw.zrange(keys.a2a_recent(), 0, -1)
    assert "t-2" in kept and "t-" + "x" * 5000 not in kept
