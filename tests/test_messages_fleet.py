"""Messages on real Celery workers, the model behind an OpenAI-wire HTTP server: what the
server saw is what each branch's model would have seen.

An explore of 5 branches whose calls take `CALL_S`; `fleet send` to branch 3 while its
first call is in flight; only branch 3's next request carries `## Messages`, and its
`check_messages` gives the text. Then a worker SIGKILLed right after a send: the run is
recovered on another worker and the message reaches the conversation exactly once.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from fleet.client import Fleet
from fleet.conversation.messages import ANNOUNCED_KEY, CHECK_MESSAGES, READ_KEY
from fleet.llm.base import LLMResponse
from fleet.models import Trace
from fleet.testing import Script, call, text
from tests.fake_provider import RateLimitedProvider, _completion
from tests.fleetkit import client, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers
from tests.test_fleet_recovery import database_url

pytestmark = pytest.mark.integration

MESSAGES_DB = 13
CALL_S = 3.0
SOLO_S = 20.0
TIMEOUT_S = 90.0
NOTE = "branch B is a dead end: look at C"


def decide(messages: list[dict[str, Any]]) -> LLMResponse:
    """The model: a root explores five branches; a branch lists, reads its mail, answers."""
    task = str(next(m for m in messages if m["role"] == "user")["content"])
    tools = [m for m in messages if m["role"] == "tool"]
    if task.startswith("Explore"):
        if not tools:
            return call("agent", task=[f"branch {i}" for i in range(1, 6)])
        return text("root done")
    last = messages[-1]
    if task.startswith("Solo") and "## Messages" in str(last["content"]):
        return text(f"heard: {last['content']}")
    if task.startswith("Solo"):
        return text("the slow answer")
    if last["role"] == "user" and "## Messages" in str(last["content"]):
        return call(CHECK_MESSAGES)
    if not tools:
        return call("list_dir", path=".")
    return text(f"{task} done; heard: {tools[-1]['content']}")


class SlowProvider(RateLimitedProvider):
    """Every branch's answer takes CALL_S (the root's 0.2 s); keeps every request."""

    def __init__(self) -> None:
        super().__init__(Script.parse({"scripts": []}, "unused"))
        self.seen: list[tuple[float, list[dict[str, Any]]]] = []
        self._lock = threading.Lock()
        self.sent = threading.Event()
        """Cleared by a test: branch 3's first answer waits until it is set (the send done)."""
        self.sent.set()

    def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        messages = request["messages"]
        with self._lock:
            self.seen.append((time.monotonic(), messages))
        response = decide(messages)
        task = str(next(m for m in messages if m["role"] == "user")["content"])
        time.sleep(self.latency_of(task, messages))
        return 200, _completion(response, 10, 5), {}

    def latency_of(self, task: str, messages: list[dict[str, Any]]) -> float:
        """A root's call 0.2 s, a branch's CALL_S, a solo root's first call SOLO_S."""
        if task.startswith("Explore"):
            return 0.2
        if task.startswith("Solo"):
            return 0.2 if "## Messages" in str(messages[-1]["content"]) else SOLO_S
        # Branch 3's first call lasts until the `fleet send` process (a second or two to
        # start, many more on a loaded machine) is done: a condition, not a clock.
        if task == "branch 3" and not any(m["role"] == "tool" for m in messages):
            self.sent.wait(TIMEOUT_S)
        return CALL_S

    def requests_of(self, task: str) -> list[list[dict[str, Any]]]:
        with self._lock:
            return [m for _, m in self.seen if _task(m) == task]


def _task(messages: list[dict[str, Any]]) -> str:
    return str(next(m for m in messages if m["role"] == "user")["content"])


@dataclass
class Setup:
    fleet: Fleet
    provider: SlowProvider
    url: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def setup(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    url = database_url(redis_url, MESSAGES_DB)
    outside = tmp_path_factory.mktemp("operator")
    workspace = tmp_path_factory.mktemp("workspace")
    with contextlib.ExitStack() as stack:
        provider = SlowProvider()
        stack.callback(provider.stop)
        config = outside / "fleet.yaml"
        local = {"kind": "openai", "base_url": f"{provider.url}/v1"}
        models = {"wire": {"provider": "local", "name": "fake-model"}}
        config.write_text(yaml.safe_dump({"providers": {"local": local}, "models": models}))
        env = {
            "FLEET_CONFIG": str(config),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
        }
        worker = stack.enter_context(start_worker(url, concurrency=8, env_extra=env))
        wait_for_workers(url, [worker.name], timeout_s=60)
        fleet = client(fleet_settings(url, workspace, **env))
        yield Setup(fleet, provider, url, env)


def branch(fleet: Fleet, root: str, name: str) -> Trace:
    [found] = [t for t in fleet.store.get_traces(fleet.store.children(root)) if t.name == name]
    return found


def users(request: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in request if m["role"] == "user"]


def test_a_message_to_branch_three_reaches_it_and_no_other(setup: Setup) -> None:
    fleet, provider = setup.fleet, setup.provider
    provider.sent.clear()
    try:
        handle = fleet.submit("Explore the options", model="wire")
        wait_until(lambda: len(provider.requests_of("branch 3")) == 1, 30, "branch 3's 1st call")
        three = branch(fleet, handle.trace_id, "explore-003")
        argv = [sys.executable, "-m", "fleetops.cli.main", "send", three.trace_id, NOTE]
        sent = subprocess.run(
            [*argv, "--from", "lead"],
            env={**setup.env, "FLEET_REDIS_URL": setup.url, "FLEET_BROKER_URL": setup.url},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        provider.sent.set()
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith("sent ") and three.trace_id in sent.stdout
    root = handle.wait(timeout_s=TIMEOUT_S)
    assert root.status == "completed"
    second = provider.requests_of("branch 3")[1]
    [block] = [u for u in users(second) if "## Messages" in u]
    assert '1 new message from "lead"' in block and json.dumps(NOTE) in block
    third = provider.requests_of("branch 3")[2]
    assert json.dumps(NOTE) in str([m for m in third if m["role"] == "tool"][-1]["content"])
    for i in (1, 2, 4, 5):
        for request in provider.requests_of(f"branch {i}"):
            assert not any("## Messages" in u for u in users(request)), i
    done = fleet.trace(three.trace_id)
    assert NOTE in (done.answer or "")
    stored = fleet.store.messages(three.trace_id)
    assert sum(ANNOUNCED_KEY in m.metadata for m in stored) == 1
    assert sum(READ_KEY in m.metadata for m in stored) == 1


def test_an_interrupt_cuts_a_20_s_call_and_the_next_request_leaves_within_a_second(
    setup: Setup,
) -> None:
    fleet, provider = setup.fleet, setup.provider
    handle = fleet.submit("Solo task", model="wire")
    wait_until(lambda: len(provider.requests_of("Solo task")) == 1, 30, "the first call")
    sent_at = time.monotonic()
    fleet.send(handle.trace_id, "use plan C", sender="lead", interrupt=True)
    wait_until(lambda: len(provider.requests_of("Solo task")) == 2, 10, "the next call")
    with provider._lock:
        left_at = [at for at, m in provider.seen if _task(m) == "Solo task"][1]
    assert left_at - sent_at < 1.0, f"the next request left {left_at - sent_at:.2f} s later"
    done = handle.wait(timeout_s=TIMEOUT_S)
    assert done.status == "completed" and '"use plan C"' in (done.answer or "")
    assert [m.role for m in fleet.store.messages(handle.trace_id)].count("assistant") == 1


def test_a_message_to_the_ended_tree_is_refused(setup: Setup) -> None:
    handle = setup.fleet.submit("Explore again", model="wire")
    root = handle.wait(timeout_s=TIMEOUT_S)
    refused = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "send", root.trace_id, "late"],
        env={**setup.env, "FLEET_REDIS_URL": setup.url, "FLEET_BROKER_URL": setup.url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0
    assert "has ended" in refused.stderr and "--continue" in refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


KILL_DB = 9


def test_a_worker_killed_after_the_block_was_sent_delivers_the_message_once(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The worker dies while branch 3's request carrying `## Messages` is in flight (the
    block is written, the turn is not); another worker recovers the branch: the block is not
    announced again, `check_messages` gives the message once."""
    url = database_url(redis_url, KILL_DB)
    outside = tmp_path_factory.mktemp("operator")
    workspace = tmp_path_factory.mktemp("workspace")
    with contextlib.ExitStack() as stack:
        provider = SlowProvider()
        stack.callback(provider.stop)
        config = outside / "fleet.yaml"
        local = {"kind": "openai", "base_url": f"{provider.url}/v1"}
        models = {"wire": {"provider": "local", "name": "fake-model"}}
        config.write_text(yaml.safe_dump({"providers": {"local": local}, "models": models}))
        env = {
            "FLEET_CONFIG": str(config),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
        }
        first = stack.enter_context(start_worker(url, concurrency=8, env_extra=env))
        wait_for_workers(url, [first.name], timeout_s=60)
        fleet = client(fleet_settings(url, workspace, **env))
        handle = fleet.submit("Explore the options", model="wire")
        wait_until(lambda: len(provider.requests_of("branch 3")) == 1, 30, "branch 3's call")
        three = branch(fleet, handle.trace_id, "explore-003")
        fleet.send(three.trace_id, NOTE, sender="lead")

        def block_sent() -> bool:
            return any(
                "## Messages" in u for r in provider.requests_of("branch 3") for u in users(r)
            )

        wait_until(block_sent, 30, "branch 3's request with the block")
        first.kill()
        second = stack.enter_context(start_worker(url, concurrency=8, env_extra=env))
        wait_for_workers(url, [second.name], timeout_s=60)
        wait_until(lambda: fleet.trace(three.trace_id).is_terminal, TIMEOUT_S, "branch 3's end")
        done = fleet.trace(three.trace_id)
        assert done.status == "completed", done.error
        stored = fleet.store.messages(three.trace_id)
        assert sum("## Messages" in str(m.content) for m in stored) == 1, "announced once"
        results = [m for m in stored if m.role == "tool" and m.name == CHECK_MESSAGES]
        assert sum(json.dumps(NOTE) in str(m.content) for m in results) == 1, "read once"
        assert NOTE in (done.answer or "")
