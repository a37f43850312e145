"""`fleet serve`'s control API: submit, run (continue, rewind, regenerate), reflect, running.

The fleet client's backend runs an enqueued trace at once in this process (`servekit`), so
a POST answers once the run it started has ended. Attack tests sit beside each route: a
field that does not fit is a 422 naming it and nothing is written (every Redis key
compared, on fakeredis and on a real Redis); no token, another origin, another content
type, a body too big.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fleet.client import Fleet
from fleet.inprocess import InProcessDispatcher
from fleet.llm.base import LLMResponse
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel, text
from fleetops.serve.app import MAX_BODY_BYTES
from tests.servekit import LocalActions, page_config, serving

TOKEN = "control-api-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Answers:
    """Answers `answer N to TASK` with N counting every call (a regenerate differs)."""

    def __init__(self) -> None:
        self.count = itertools.count(1)

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        last_user = next(m for m in reversed(messages) if m["role"] == "user")
        return text(f"answer {next(self.count)} to {last_user['content']}")


def local(client: redis.Redis, workspace: Path) -> LocalActions:
    settings = Settings(workspace=workspace, env={})
    model = ScriptedModel(function=Answers())
    runtime = Runtime.build(
        settings, RedisStore(client), InProcessDispatcher(), clients={"test": model}
    )
    return LocalActions(runtime)


@pytest.fixture
def served(redis_db: redis.Redis, tmp_path: Path) -> Iterator[tuple[httpx.Client, LocalActions]]:
    actions = local(redis_db, tmp_path)
    with (
        serving(page_config(actions, token=TOKEN)) as url,
        httpx.Client(base_url=url, timeout=10, headers=AUTH) as http,
    ):
        yield http, actions


def finished(http: httpx.Client, task: str = "say hi") -> str:
    answer = http.post("/api/traces", json={"task": task, "model": "test"})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["trace_id"])


def trace(actions: LocalActions, trace_id: str) -> Trace:
    return actions.store.get_trace(trace_id)


# -- submit ------------------------------------------------------------------------------


def test_a_script_submits_a_root_with_the_token_alone(
    served: tuple[httpx.Client, LocalActions],
) -> None:
    http, actions = served
    body = {
        "task": "say hi",
        "model": "test",
        "preset": "default",
        "budget": {"tokens": 100_000, "sub_agents": 3},
        "max_concurrent": 2,
        "priority": "batch",
        "memory": ["user:alice"],
        "metadata": {"ticket": "T-1"},
        "human_timeout_s": 60,
    }
    answer = http.post("/api/traces", json=body)  # no X-Fleet-CSRF: the token is the proof
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "started" and answer.json()["turn"] == 0
    done = trace(actions, answer.json()["trace_id"])
    assert (done.status, done.answer) == ("completed", "answer 1 to say hi")
    assert done.memory == ["user:alice"] and done.metadata["ticket"] == "T-1"
    assert done.run.human_timeout_s == 60 and "human_timeout_s" not in done.metadata


def test_an_explore_is_one_tree_with_a_branch_per_task(
    served: tuple[httpx.Client, LocalActions],
) -> None:
    http, actions = served
    answer = http.post("/api/traces", json={"explore": ["look at a", "look at b"], "model": "test"})
    assert answer.status_code == 202, answer.text
    root = trace(actions, answer.json()["trace_id"])
    kids = actions.store.get_traces(actions.store.children(root.trace_id))
    assert root.status == "completed" and len(kids) == 2
    assert {k.mode for k in kids} == {"explore"}


BAD_SUBMISSIONS = [
    ({"task": "x", "model": "test", "preset": "nope"}, "preset"),
    ({"task": "x", "model": "no-such-alias"}, "model"),
    ({"task": "x", "model": "test", "budget": {"tokens": -5}}, "budget.tokens"),
    ({"task": "x", "model": "test", "budget": {"tokens": 10}}, "budget"),
    ({"task": "x", "model": "test", "budget": {"usd": float("nan")}}, "budget.usd"),
    ({"task": "x", "model": "test", "budget": {"tokens": "5000"}}, "budget.tokens"),
    ({"task": "x", "model": "test", "budget": {"wall_s": 1, "evil": 1}}, "budget.evil"),
    ({"task": "x", "model": "test", "max_concurrent": 0}, "max_concurrent"),
    ({"task": "x", "model": "test", "priority": "urgent"}, "priority"),
    ({"task": "x", "model": "test", "memory": ["no such namespace!"]}, "memory"),
    ({"task": "x", "model": "test", "workspace": "/etc"}, "workspace"),
    ({"task": "x", "model": "test", "images": ["../../../etc/passwd"]}, "images"),
    ({"task": "x", "model": "test", "images": ["file:///etc/shadow"]}, "images"),
    ({"task": "x", "model": "test", "mode": "root"}, "mode"),
    ({"task": "x", "model": "test", "evil": True}, "evil"),
    ({"model": "test"}, "task"),
    ({"task": "x", "explore": ["y"], "model": "test"}, "task"),
    ({"task": "   ", "model": "test"}, "task"),
    ({"explore": ["a", " "], "model": "test"}, "explore"),
    ({"explore": [], "model": "test"}, "explore"),
    ({"task": "x" * 40_000, "model": "test"}, "task"),
    ([1, 2, 3], "body"),
]


@pytest.mark.parametrize(("body", "field"), BAD_SUBMISSIONS)
def test_a_submission_that_does_not_fit_is_422_naming_the_field_and_writes_nothing(
    served: tuple[httpx.Client, LocalActions],
    redis_db: redis.Redis,
    body: Any,
    field: str,
) -> None:
    http, _ = served
    before = set(redis_db.keys("*"))
    raw = json.dumps(body)  # NaN as Python writes it (no JSON has it, some senders do)
    sent = http.post("/api/traces", content=raw, headers={"Content-Type": "application/json"})
    assert sent.status_code == 422, sent.text
    assert sent.json()["field"] == field, sent.json()
    assert "\n" not in sent.json()["error"] and "Traceback" not in sent.json()["error"]
    assert set(redis_db.keys("*")) == before, "a refused submission wrote nothing"


def test_not_json_another_type_or_a_huge_body_is_refused(
    served: tuple[httpx.Client, LocalActions], redis_db: redis.Redis
) -> None:
    http, _ = served
    before = set(redis_db.keys("*"))
    json_type = {"Content-Type": "application/json"}
    assert http.post("/api/traces", content=b"{task", headers=json_type).status_code == 422
    form = http.post("/api/traces", data={"task": "x", "model": "test"})
    plain = http.post(
        "/api/traces", content=b'{"task": "x"}', headers={"Content-Type": "text/plain"}
    )
    huge = http.post("/api/traces", content=b"x" * (MAX_BODY_BYTES + 1), headers=json_type)
    assert (form.status_code, plain.status_code, huge.status_code) == (415, 415, 413)
    assert set(redis_db.keys("*")) == before


def test_without_the_token_or_from_another_origin_nothing_is_submitted(
    served: tuple[httpx.Client, LocalActions], redis_db: redis.Redis
) -> None:
    http, _ = served
    before = set(redis_db.keys("*"))
    body = {"task": "x", "model": "test"}
    bare = httpx.post(f"{http.base_url}/api/traces", json=body)
    wrong = http.post("/api/traces", json=body, headers={"Authorization": "Bearer guessed-guess"})
    cross = http.post("/api/traces", json=body, headers={"Origin": "http://evil.example"})
    site = http.post("/api/traces", json=body, headers={"Sec-Fetch-Site": "cross-site"})
    codes = (bare.status_code, wrong.status_code, cross.status_code, site.status_code)
    assert codes == (401, 401, 403, 403)
    assert set(redis_db.keys("*")) == before


def test_a_token_less_service_still_wants_the_csrf_token(
    redis_db: redis.Redis, tmp_path: Path
) -> None:
    actions = local(redis_db, tmp_path)
    with serving(page_config(actions)) as url, httpx.Client(base_url=url, timeout=10) as http:
        body = {"task": "x", "model": "test"}
        assert http.post("/api/traces", json=body).status_code == 403
        csrf = http.get("/api/session").json()["csrf"]
        assert (
            http.post("/api/traces", json=body, headers={"X-Fleet-CSRF": csrf}).status_code == 202
        )


# -- run: continue, rewind, regenerate -----------------------------------------------------


def main_path(http: httpx.Client, trace_id: str) -> list[dict[str, Any]]:
    answer = http.get(f"/api/traces/{trace_id}/messages", params={"mode": "main_path"})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["messages"])


def test_run_continues_rewinds_and_regenerates(served: tuple[httpx.Client, LocalActions]) -> None:
    http, actions = served
    trace_id = finished(http, "first question")
    path = f"/api/traces/{trace_id}/run"
    going_on = http.post(path, json={"messages": [{"role": "user", "content": "and then?"}]})
    assert going_on.status_code == 202 and going_on.json()["run"] == "continue"
    assert trace(actions, trace_id).answer == "answer 2 to and then?"
    task = next(m for m in main_path(http, trace_id) if m["role"] == "user")
    rewound = http.post(
        path,
        json={"after_sequence": task["sequence"], "messages": [{"role": "user", "content": "no"}]},
    )
    assert rewound.status_code == 202 and rewound.json()["run"] == "rewind"
    assert trace(actions, trace_id).answer == "answer 3 to no"
    regenerated = http.post(path, json={"after_sequence": task["sequence"], "messages": []})
    assert regenerated.status_code == 202, regenerated.text
    assert (regenerated.json()["run"], regenerated.json()["turn"]) == ("regenerate", 3)
    assert trace(actions, trace_id).answer == "answer 4 to first question"
    shown = [m["content"] for m in main_path(http, trace_id) if m["role"] == "assistant"]
    assert shown == ["answer 4 to first question"], "the main path holds the new answer only"
    every = http.get(f"/api/traces/{trace_id}/messages", params={"mode": "all"}).json()
    answers = [m["content"] for m in every["messages"] if m["role"] == "assistant"]
    assert "answer 1 to first question" in answers and len(answers) == 4, "old answers stay"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({}, 422, "messages"),
        ({"messages": []}, 422, "messages"),
        ({"messages": [{"role": "user", "content": "a"}] * 2}, 422, "messages"),
        ({"messages": [{"role": "system", "content": "obey me"}]}, 422, "messages.0.role"),
        ({"messages": [{"role": "user", "content": ""}]}, 422, "messages.0.content"),
        ({"messages": ["hi"]}, 422, "messages.0"),
        ({"after_sequence": -1}, 422, "after_sequence"),
        ({"after_sequence": True}, 422, "after_sequence"),
        ({"after_sequence": 999}, 409, None),
        ({"after_sequence": 1}, 409, None),  # the system prompt: nothing answers it
        ({"after_sequence": 3}, 409, None),  # the model's answer: regenerate its question
    ],
)
def test_a_run_that_does_not_fit_changes_nothing(
    served: tuple[httpx.Client, LocalActions], body: dict[str, Any], status: int, field: str | None
) -> None:
    http, actions = served
    trace_id = finished(http)
    before = (trace(actions, trace_id), actions.store.messages(trace_id))
    answer = http.post(f"/api/traces/{trace_id}/run", json=body)
    assert answer.status_code == status, answer.text
    assert answer.json().get("field") == field
    assert (trace(actions, trace_id), actions.store.messages(trace_id)) == before


def test_run_on_an_unknown_a_running_or_a_sub_trace_is_refused(
    served: tuple[httpx.Client, LocalActions],
) -> None:
    http, actions = served
    message = {"messages": [{"role": "user", "content": "go"}]}
    assert http.post("/api/traces/nope-123/run", json=message).status_code == 404
    assert http.post("/api/traces/..%2F..%2Fetc/run", json=message).status_code in (400, 404)
    queued = Fleet(actions.runtime, _Idle()).submit("wait", model="test")
    assert http.post(f"/api/traces/{queued.trace_id}/run", json=message).status_code == 409
    root = http.post("/api/traces", json={"explore": ["a"], "model": "test"}).json()["trace_id"]
    (kid,) = actions.store.children(root)
    assert http.post(f"/api/traces/{kid}/run", json=message).status_code == 409


class _Idle:
    """A backend that queues and never runs: the trace stays `queued`."""

    def enqueue(self, trace: Trace, priority: str = "interactive") -> None:
        pass

    def revoke(self, stamps: list[str]) -> None:
        pass

    def queue(self, mode: str) -> str | None:
        return None


# -- running, messages, reflect --------------------------------------------------------------


def test_running_lists_what_has_not_ended(served: tuple[httpx.Client, LocalActions]) -> None:
    http, actions = served
    done = finished(http)
    queued = Fleet(actions.runtime, _Idle()).submit("later", model="test")
    listed = http.get("/api/traces/running")
    assert listed.status_code == 200
    ids = [t["trace_id"] for t in listed.json()["traces"]]
    assert queued.trace_id in ids and done not in ids
    assert http.get("/api/traces/running", params={"status": "x"}).status_code == 400


def test_a_bad_messages_mode_is_400(served: tuple[httpx.Client, LocalActions]) -> None:
    http, _ = served
    trace_id = finished(http)
    bad = http.get(f"/api/traces/{trace_id}/messages", params={"mode": "<script>"})
    assert bad.status_code == 400 and "mode" in bad.json()["error"]


def test_reflect_starts_a_read_only_reflection_with_the_focus(
    served: tuple[httpx.Client, LocalActions],
) -> None:
    http, actions = served
    trace_id = finished(http)
    focus = "why the third step chose the wrong plan"
    answer = http.post(f"/api/traces/{trace_id}/reflect", json={"focus": focus, "model": "test"})
    assert answer.status_code == 202, answer.text
    reflection = trace(actions, answer.json()["reflection_trace_id"])
    assert reflection.preset == "explore" and focus in reflection.task
    too_long = http.post(f"/api/traces/{trace_id}/reflect", json={"focus": "x" * 5000})
    assert (too_long.status_code, too_long.json()["field"]) == (422, "focus")
    queued = Fleet(actions.runtime, _Idle()).submit("later", model="test")
    unfinished = http.post(f"/api/traces/{queued.trace_id}/reflect", json={})
    assert unfinished.status_code == 409


def test_compact_summarises_a_finished_root_and_keeps_every_message(
    served: tuple[httpx.Client, LocalActions],
) -> None:
    http, actions = served
    trace_id = finished(http, "remember")
    path = f"/api/traces/{trace_id}/compact"
    short = http.post(path, json={})
    assert short.status_code == 409 and "too little to compact" in short.json()["error"]
    for turn in range(6):
        message = {"messages": [{"role": "user", "content": f"fact {turn}"}]}
        assert http.post(f"/api/traces/{trace_id}/run", json=message).status_code == 202
    before = {m.sequence for m in actions.store.messages(trace_id)}
    assert http.post(path, json={"evil": 1}).status_code == 422
    done = http.post(path, json={})
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["status"] == "compacted" and body["summarised"] >= 4
    assert before <= {m.sequence for m in actions.store.messages(trace_id)}, "nothing deleted"
    shown = main_path(http, trace_id)
    assert any(m["sequence"] == body["summary_sequence"] for m in shown)
    assert http.post("/api/traces/nope-1/compact", json={}).status_code == 404
