"""Structured results and context windows on a real worker, the model behind an OpenAI-wire
HTTP server (`tests.fake_provider`, answering from a script): the worker's real OpenAI client
sends every request over HTTP, so what the server saw is what the model would have seen.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from fleet.client import Fleet
from fleet.loop.fit import estimate_tokens
from fleet.testing import Script
from tests.fake_provider import RateLimitedProvider
from tests.fleetkit import client, fleet_settings
from tests.procs import start_worker, wait_for_workers
from tests.test_fleet_recovery import database_url

pytestmark = pytest.mark.integration

STRUCTURED_DB = 14
WINDOW = 3500  # the default preset offers every tool: their schemas take ~2.4k tokens
TIMEOUT_S = 60.0
VERDICT = "VERDICT: pass\nREASONS:\n- the file is there\nSUGGESTIONS:\n- none"
REPORT = {"files": 3, "names": ["a.txt", "b.txt", "c.txt"]}


def braces(text: str) -> str:
    """A script's `content` is a format string: literal braces are doubled."""
    return text.replace("{", "{{").replace("}", "}}")


def script() -> Script:
    rules = [
        {
            "match": "^Evaluate whether",
            "steps": [{"content": "it looks fine"}, {"content": VERDICT}],
        },
        {
            "match": "^count the files",
            "steps": [{"content": "three"}, {"content": braces(json.dumps(REPORT))}],
        },
        {
            "match": "^read the parts",
            "steps": [
                *(
                    {"tool_calls": [{"name": "read_file", "arguments": {"path": f"part{i}.txt"}}]}
                    for i in range(6)
                ),
                {"content": "read them all"},
            ],
        },
        {
            "match": "^judge it",
            "steps": [{"tool_calls": [{"name": "evaluate"}]}, {"content": "{last_tool}"}],
        },
        {
            "match": "^report it",
            "steps": [
                {
                    "tool_calls": [
                        {
                            "name": "agent",
                            "arguments": {"task": "count the files", "agent_type": "reporter"},
                        }
                    ]
                },
                {"content": "{last_tool}"},
            ],
        },
    ]
    return Script.parse({"scripts": rules}, "structured")


class RecordingProvider(RateLimitedProvider):
    """The fake provider, remembering the size of every request it was sent."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.sizes: list[int] = []
        self._sizes_lock = threading.Lock()

    def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._sizes_lock:
            self.sizes.append(estimate_tokens(request["messages"], request.get("tools") or []))
        return super().answer(request)


@dataclass
class Setup:
    fleet: Fleet
    provider: RecordingProvider


@pytest.fixture(scope="module")
def setup(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    url = database_url(redis_url, STRUCTURED_DB)
    outside = tmp_path_factory.mktemp("operator")  # config and presets: outside the workspace
    workspace = tmp_path_factory.mktemp("workspace")
    for i in range(6):
        (workspace / f"part{i}.txt").write_text(str(i) * 3000)
    agents = outside / "agents"
    agents.mkdir()
    schema = {
        "type": "object",
        "properties": {"files": {"type": "integer"}, "names": {"type": "array"}},
        "required": ["files", "names"],
    }
    front = yaml.safe_dump({"name": "reporter", "output_schema": schema})
    (agents / "reporter.md").write_text(f"---\n{front}---\nYou count files.\n")
    with contextlib.ExitStack() as stack:
        provider = RecordingProvider(script())
        stack.callback(provider.stop)
        config = outside / "fleet.yaml"
        local = {"kind": "openai", "base_url": f"{provider.url}/v1"}
        models = {
            "wire": {"provider": "local", "name": "fake-model"},
            "tiny": {"provider": "local", "name": "fake-model", "context_window": WINDOW},
        }
        config.write_text(yaml.safe_dump({"providers": {"local": local}, "models": models}))
        env = {
            "FLEET_CONFIG": str(config),
            "FLEET_AGENTS_DIR": str(agents),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
        }
        worker = stack.enter_context(start_worker(url, concurrency=4, env_extra=env))
        wait_for_workers(url, [worker.name], timeout_s=60)
        fleet = client(fleet_settings(url, workspace, **env))
        yield Setup(fleet, provider)


def fenced_json(text: str) -> Any:
    return json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])


def test_an_evaluate_answering_without_a_verdict_is_corrected(setup: Setup) -> None:
    root = setup.fleet.submit("judge it", model="wire").wait(timeout_s=TIMEOUT_S)
    assert root.status == "completed", root.error
    (judge_id,) = setup.fleet.store.children(root.trace_id)
    judge = setup.fleet.trace(judge_id)
    expected = {"verdict": "pass", "reasons": ["the file is there"], "suggestions": ["none"]}
    assert judge.output == expected
    messages = setup.fleet.store.messages(judge_id)
    assert [m.content for m in messages if m.role == "assistant"] == ["it looks fine", VERDICT]
    assert sum(1 for m in messages if m.metadata.get("correction")) == 1
    (entry,) = setup.fleet.store.collaborators(root.trace_id)
    assert entry.output == expected
    assert "verdict: pass" in (root.answer or "") and fenced_json(root.answer or "") == expected


def test_a_preset_output_schema_returns_json_the_parent_parses(setup: Setup) -> None:
    root = setup.fleet.submit("report it", model="wire").wait(timeout_s=TIMEOUT_S)
    assert root.status == "completed", root.error
    (child_id,) = setup.fleet.store.children(root.trace_id)
    assert setup.fleet.trace(child_id).output == REPORT
    assert fenced_json(root.answer or "") == REPORT, "the parent's tool result is the JSON"


def test_a_tiny_context_window_keeps_every_request_under_it(setup: Setup) -> None:
    before = len(setup.provider.sizes)
    root = setup.fleet.submit("read the parts", model="tiny").wait(timeout_s=TIMEOUT_S)
    assert root.status == "completed", root.error
    sizes = setup.provider.sizes[before:]
    assert len(sizes) == 7 and max(sizes) <= WINDOW * 0.8, sizes
    assert root.run.context is not None and root.run.context.compactions >= 1
    stored = [m for m in setup.fleet.store.messages(root.trace_id) if m.role == "tool"]
    assert len(stored) == 6 and all(len(m.content or "") >= 3000 for m in stored)
