"""Two fleets, each its own `fleet up` (its project folder, embedded Redis, workers): A2A between.

The seeds' cross-device scenario (shared/seeds, 003 "跨设备 Agent 通信") end to end, as
docs/a2a.md shows it: fleet B runs `fleet up` and `fleet a2a` in its project folder with a
preset marked `a2a: true` (the "terminal agent"); fleet A runs `fleet up` in its own folder
with B's endpoint in its fleet.yaml's `remote_agents`. A's tree delegates
(`agent(task, agent="terminal")`), reads back `sub_trace_id: agent://terminal/<task id>`,
and continues that remote conversation (`continue_from="agent://terminal/<task id>"`):
B's one tree gets both messages. A's model is a local server speaking OpenAI's wire,
whose answers are a function of the conversation (the remote id it read), never a real LLM.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.client import Fleet
from fleet.llm.base import LLMResponse
from fleet.models import Trace
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import call, text
from fleetops.discovery import UpState
from tests.a2a_agent import free_port
from tests.fake_provider import RateLimitedProvider
from tests.fleetkit import client, fleet_settings, wait_until
from tests.test_cli_ops import FLEET, up_env
from tests.test_fleet_recovery import fleet_client
from tests.test_supervisor import fleet_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
TOKEN = "team-b-token-0123456789"
REMOTE_ID = re.compile(r"agent://terminal/[\w.-]+")


class MainAgent:
    """Fleet A's model: delegate, continue the remote id it was given, then answer."""

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        told = next((str(m["content"]) for m in reversed(messages) if m["role"] == "tool"), "")
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        if "to be stopped" in task:  # B's tree will wait on a person until A stops it
            if turn == 0:
                return call("agent", task="ask me which module", agent="terminal")
            return text(f"A heard: {told}")
        if turn == 0:
            return call("agent", task="analyse the local project", agent="terminal")
        if turn == 1:
            found = REMOTE_ID.search(told)
            assert found is not None, told
            return call("agent", task="now focus on the core module", continue_from=found[0])
        return text(f"A heard: {told}")


def answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def fleet_b(tmp: Path) -> Iterator[tuple[UpState, str]]:
    """Fleet B: `fleet up` and `fleet a2a` in its folder, serving the `terminal` preset."""
    folder, conf = tmp / "fleet-b", tmp / "fleet-b-conf"
    folder.mkdir()
    (conf / "agents").mkdir(parents=True)
    (conf / "agents" / "terminal.md").write_text(
        "---\nname: terminal\ndescription: the terminal agent\na2a: true\n---\nAnalyse.\n"
    )
    asks = [
        {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which module?"}}]},
        {"content": "B got: {last_tool}"},
    ]
    steps = [{"content": "B turn {turn}: {last_user}"}]
    rules = [{"match": "^ask me", "steps": asks}, {"match": ".*", "steps": steps}]
    (conf / "b.yaml").write_text(yaml.safe_dump({"scripts": rules}))
    env = {"FLEET_AGENTS_DIR": str(conf / "agents"), "FLEET_MODEL": f"scripted:{conf / 'b.yaml'}"}
    with fleet_up(folder, "--workers", "1", "--concurrency", "2", **env) as (_, state):
        port = free_port()
        a2a_env = up_env(folder, FLEET_WORKSPACE=str(folder), FLEET_ALLOW_SCRIPTED="1", **env) | {
            "FLEET_SERVE_TOKEN": TOKEN
        }
        with (tmp / "b-a2a.log").open("wb") as log:
            served = subprocess.Popen(
                [*FLEET, "a2a", "--port", str(port)],
                env=a2a_env,
                cwd=folder,  # finds the fleet `fleet up` started here
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: answers(port) or served.poll() is not None, 60, "fleet a2a of B")
            assert served.poll() is None, (tmp / "b-a2a.log").read_text()
            yield state, f"http://127.0.0.1:{port}/"
        finally:
            served.terminate()
            served.wait(10)


def test_a_tree_of_one_fleet_up_delegates_to_and_continues_a_preset_of_another(
    tmp_path: Path,
) -> None:
    with contextlib.ExitStack() as stack:
        b_state, b_url = stack.enter_context(fleet_b(tmp_path))
        provider = stack.enter_context(RateLimitedProvider(MainAgent()))  # type: ignore[arg-type]
        folder, conf = tmp_path / "fleet-a", tmp_path / "fleet-a-conf"
        folder.mkdir()
        conf.mkdir()
        remote = {"terminal": {"url": b_url, "token_env": "TEAMB_TOKEN", "private": True}}
        local = {"kind": "openai", "base_url": f"{provider.url}/v1"}
        config = {
            "remote_agents": remote,
            "providers": {"local": local},
            "models": {"main": {"provider": "local", "name": "fake-model"}},
        }
        (conf / "fleet.yaml").write_text(yaml.safe_dump(config))
        env = {
            "FLEET_CONFIG": str(conf / "fleet.yaml"),
            "TEAMB_TOKEN": TOKEN,
            "FLEET_REMOTE_POLL_S": "0.3",
        }
        _, a_state = stack.enter_context(fleet_up(folder, "--workers", "1", **env))
        assert a_state.redis_url != b_state.redis_url  # two fleets, two Redis
        started = time.monotonic()
        run = subprocess.run(
            [*FLEET, "run", "--model", "main", "--json", "ask the terminal agent"],
            env=up_env(folder, FLEET_WORKSPACE=str(folder), **env),
            cwd=folder,  # finds fleet A
            capture_output=True,
            text=True,
            timeout=180,
        )
        took = time.monotonic() - started
        assert run.returncode == 0, run.stdout + run.stderr
        root_id = json.loads(run.stdout)["trace_id"]
        shown = subprocess.run(
            [*FLEET, "trace", "show", root_id],
            env=up_env(folder, FLEET_WORKSPACE=str(folder), **env),
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=60,
        )
        with fleet_client(a_state.redis_url, a_state.redis_url, folder) as a:
            root = a.trace(root_id)
            (entry,) = a.store.collaborators(root_id)
        with fleet_client(b_state.redis_url, b_state.redis_url, tmp_path / "fleet-b") as b:
            b_roots = [t for t in b.store.list_traces(100) if t.parent_trace_id is None]
            b_said = [
                [m.content for m in b.store.messages(t.trace_id) if m.role == "user"]
                for t in b_roots
            ]
            a = client(fleet_settings(a_state.redis_url, folder, **env))
            try:
                stopped, b_tree = stop_across(a, b)
            finally:
                assert isinstance(a.store, RedisStore)
                a.store.close()
    assert root.status == "completed", root.error
    assert "B turn 1: now focus on the core module" in str(root.answer)
    # One remote child, continued: its entry names the second task of the same conversation.
    assert entry.remote_id is not None and REMOTE_ID.fullmatch(entry.remote_id)
    assert shown.returncode == 0 and f"remote {entry.remote_id} [completed]" in shown.stdout
    # Fleet B ran ONE tree of its `terminal` preset, which got both messages: the same
    # remote context (the seeds' "持续对话").
    assert [(t.preset, t.status) for t in b_roots] == [("terminal", "completed")]
    assert b_said == [["analyse the local project", "now focus on the core module"]]
    assert took < 150
    # `fleet stop` on A: A's child (waiting on B's question) stops, B's task is cancelled,
    # and B's tree stops.
    assert stopped.status == "stopped"
    assert b_tree.status == "stopped" and b_tree.task == "ask me which module"


def stop_across(a: Fleet, b: Fleet) -> tuple[Trace, Trace]:
    """A's tree waits on B's tree's question; A's stop reaches B. (A's root, B's root.)"""
    before = {t.trace_id for t in b.store.list_traces(100)}
    handle = a.submit("a task to be stopped", model="main")

    def asked() -> bool:
        found = [a.trace(c) for c in a.store.children(handle.trace_id)]
        return bool(found) and found[0].run.waiting_on is not None

    wait_until(asked, 60, "B's question reached A's child")
    (b_root,) = [t for t in b.store.list_traces(100) if t.trace_id not in before]
    a.stop(handle.trace_id)
    root = handle.wait(60)
    wait_until(lambda: b.trace(b_root.trace_id).status == "stopped", 60, "B's tree stopped")
    return root, b.trace(b_root.trace_id)
