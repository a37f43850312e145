"""Long-term memory on real Celery workers and a real Redis: record, recall, refuse, recover."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.client import Fleet
from fleet.lifecycle.recorder import recorder_id
from fleet.models import Trace
from tests.procs import WorkerProcess
from tests.test_fleet_recovery import FAST_RECOVERY, database_url, fleet_client, start_workers

# Several CLI, worker and fleet processes a test: minutes, not seconds, on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MEMORY_DB = 11
FLEET = [sys.executable, "-m", "fleetops.cli.main"]
TIMEOUT_S = 60.0
ALICE, BOB = "user:alice", "user:bob"
READ = {"name": "memory_read", "arguments": {"key": "profile"}}
WRITE = {
    "name": "memory_write",
    "arguments": {"key": "profile", "value": {"lives": "Tongzhou"}, "expected_version": 0},
}
SCRIPTS: list[dict[str, Any]] = [
    # The recorder of a conversation where she said where she lives: read, write, done.
    {
        "match": "^Record what.*I live in Tongzhou",
        "steps": [{"tool_calls": [READ]}, {"tool_calls": [WRITE]}, {"content": "recorded"}],
    },
    {"match": "^Record what", "steps": [{"content": "nothing worth keeping"}]},
    {"match": "^I live in", "steps": [{"content": "noted"}]},
    {
        "match": "^What's the weather",
        "steps": [
            {"tool_calls": [{"name": "agent", "arguments": {"task": "weather where she lives"}}]},
            {"content": "{last_tool}"},
        ],
    },
    {"match": "^weather where", "steps": [{"content": "sunny"}]},
    {
        "match": "^whose profile",
        "steps": [
            {
                "tool_calls": [
                    READ,
                    {"name": "memory_read", "arguments": {"key": "profile", "namespace": ALICE}},
                    {"name": "memory_search", "arguments": {"query": "Tongzhou lives"}},
                    {"name": "memory_search", "arguments": {"query": "lives", "namespace": ALICE}},
                ]
            },
            {"content": "done"},
        ],
    },
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("memory-ws")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("memory-config") / "fleet.yaml"
    path.write_text(yaml.safe_dump({"memory": {"record": True}}))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("memory-model") / "m.yaml"
    path.write_text(yaml.safe_dump({"scripts": SCRIPTS, "latency_ms": 300}))
    return f"scripted:{path}"


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, MEMORY_DB)


@pytest.fixture(scope="module")
def workers(url: str, workspace: Path, config: Path) -> Iterator[list[WorkerProcess]]:
    env = {"FLEET_WORKSPACE": str(workspace), "FLEET_CONFIG": str(config), **FAST_RECOVERY}
    env["FLEET_WORKSPACE_ROOTS"] = str(workspace)  # fleet.yaml is outside every root
    with contextlib.ExitStack() as stack:
        yield start_workers(stack, url, 2, concurrency=4, env_extra=env)


@pytest.fixture
def fleet(url: str, workspace: Path, workers: list[WorkerProcess]) -> Iterator[Fleet]:
    with fleet_client(url, url, workspace) as client:
        for namespace in client.memory.namespaces():
            for entry in client.memory.entries(namespace):
                client.memory.remove(namespace, entry.key)
        yield client


def cli(url: str, workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_REDIS_URL": url, "FLEET_WORKSPACE": str(workspace), "FLEET_ALLOW_SCRIPTED": "1"}
    return subprocess.run(
        [*FLEET, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def ended(fleet: Fleet, trace_id: str) -> Trace:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            trace = fleet.store.get_trace(trace_id)
            if trace.is_terminal:
                return trace
        time.sleep(0.1)
    raise AssertionError(f"{trace_id} did not end")


def system_prompt(fleet: Fleet, trace_id: str) -> str:
    return str(fleet.store.messages(trace_id)[0].content)


def test_a_fact_recorded_in_one_conversation_reaches_the_next_and_never_bob(
    fleet: Fleet, model: str, url: str, workspace: Path
) -> None:
    first = fleet.submit("I live in Tongzhou.", model=model, memory=[ALICE])
    root = first.wait(timeout_s=TIMEOUT_S)
    recorder = ended(fleet, recorder_id(root))
    assert recorder.status == "completed", recorder.error
    assert recorder.parent_trace_id is None and recorder.context["recorded_from"] == root.trace_id
    assert root.finished_at_ms is not None and root.finished_at_ms <= recorder.created_at_ms
    shown = cli(url, workspace, "memory", "show", ALICE, "profile", "--json")
    assert shown.returncode == 0, shown.stderr
    entry = json.loads(shown.stdout)
    assert (entry["value"], entry["version"], entry["writer"]) == (
        {"lives": "Tongzhou"},
        1,
        "recorder",
    )
    second = fleet.submit("What's the weather?", model=model, memory=[ALICE]).wait(TIMEOUT_S)
    assert second.status == "completed" and (second.answer or "").endswith("sunny")
    assert '{"lives": "Tongzhou"}' in system_prompt(fleet, second.trace_id)
    [delegate] = fleet.store.children(second.trace_id)
    assert fleet.store.get_trace(delegate).memory == [ALICE]
    assert '{"lives": "Tongzhou"}' in system_prompt(fleet, delegate)
    bob = fleet.submit("whose profile", model=model, memory=[BOB]).wait(timeout_s=TIMEOUT_S)
    outputs = [str(m.content) for m in fleet.store.messages(bob.trace_id) if m.role == "tool"]
    assert len(outputs) == 4 and all("Tongzhou" not in o for o in outputs)
    assert "not bound" in outputs[1] and "not bound" in outputs[3]
    assert "Tongzhou" not in system_prompt(fleet, bob.trace_id)


def test_operators_set_show_and_compare_and_set(fleet: Fleet, url: str, workspace: Path) -> None:
    done = cli(url, workspace, "memory", "set", "project:acme", "style", '{"indent": 4}')
    assert done.returncode == 0, done.stderr
    stale = cli(
        url, workspace, "memory", "set", "project:acme", "style", "x", "--expected-version", "0"
    )
    assert stale.returncode == 1 and len(stale.stderr.strip().splitlines()) == 1
    assert "at version 1" in stale.stderr
    fresh = cli(
        url,
        workspace,
        "memory",
        "set",
        "project:acme",
        "style",
        "tabs",
        "--expected-version",
        "1",
        "--json",
    )
    assert json.loads(fresh.stdout) == {"landed": True, "version": 2}
    history = json.loads(
        cli(url, workspace, "memory", "history", "project:acme", "style", "--json").stdout
    )
    assert [h["value"] for h in history] == ["tabs", {"indent": 4}]
    assert "project:acme" in cli(url, workspace, "memory", "list").stdout
    big = cli(url, workspace, "memory", "set", "project:acme", "big", "x" * 20_000)
    assert big.returncode == 2 and "over the cap" in big.stderr
    assert len(big.stderr.strip().splitlines()) == 1
    bad = cli(url, workspace, "memory", "show", "USER:*", "k")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr
    gone = cli(url, workspace, "memory", "rm", "project:acme", "style")
    assert gone.returncode == 0
    assert cli(url, workspace, "memory", "show", "project:acme", "style").returncode == 2


def test_sixteen_trees_on_two_workers_racing_on_one_key_lose_nothing_silently(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Each root (the recorder preset: it may write) writes its own value as a new key.
    scripts: list[dict[str, Any]] = [
        {
            "match": f"^race {n}$",
            "steps": [
                {
                    "tool_calls": [
                        {"name": "memory_write", "arguments": {"key": "shared", "value": {"w": n}}}
                    ]
                },
                {"content": "{last_tool}"},
            ],
        }
        for n in range(16)
    ]
    (tmp_path / "race.yaml").write_text(yaml.safe_dump({"scripts": scripts}))
    race = f"scripted:{tmp_path / 'race.yaml'}"
    handles = [
        fleet.submit(f"race {n}", model=race, preset="recorder", memory=["project:race"])
        for n in range(16)
    ]
    answers = {n: h.wait(timeout_s=TIMEOUT_S).answer or "" for n, h in enumerate(handles)}
    landed = [
        n for n, a in answers.items() if a.startswith("wrote project:race shared as version 1")
    ]
    lost = [
        n for n, a in answers.items() if a.startswith("lost: project:race shared is at version 1")
    ]
    assert len(landed) == 1 and len(lost) == 15, answers
    [entry] = fleet.memory.history("project:race", "shared")
    assert entry.version == 1 and entry.value == {"w": landed[0]}


def test_a_recorder_whose_worker_is_killed_is_retried_and_writes_once(
    fleet: Fleet, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    # Last in the module: it kills one of the two workers.
    home = {"name": "memory_write", "arguments": {"key": "home", "value": "Tongzhou"}}
    scripts = [
        {"match": "^Record what", "steps": [{"tool_calls": [home]}, {"content": "recorded"}]},
        {"match": ".*", "steps": [{"content": "noted"}]},
    ]
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump({"scripts": scripts, "latency_ms": 1500}))
    slow = f"scripted:{tmp_path / 'slow.yaml'}"
    root = fleet.submit("I live in Tongzhou.", model=slow, memory=[ALICE]).wait(TIMEOUT_S)
    answered_ms = root.finished_at_ms
    assert root.answer == "noted" and answered_ms is not None
    rec = recorder_id(root)
    deadline = time.monotonic() + TIMEOUT_S
    while not fleet.memory.history(ALICE, "home"):  # its write landed; its next turn is slow
        assert time.monotonic() < deadline, "the recorder never wrote"
        time.sleep(0.05)
    holder = fleet.store.lease_holder(rec)
    assert holder is not None, "the recorder is between runs: too late to kill it"
    [victim] = [w for w in workers if holder.split(":")[1] == str(w.pid)]
    os.killpg(victim.pid, signal.SIGKILL)
    recorder = ended(fleet, rec)
    assert recorder.status == "completed", recorder.error
    assert recorder.created_at_ms >= answered_ms, "the root's answer came first"
    assert [e.version for e in fleet.memory.history(ALICE, "home")] == [1], "written once"
