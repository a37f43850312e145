"""`POST /api/traces/{id}/messages`: a gateway's message into a running trace's inbox."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from fleet.client import Fleet
from fleet.conversation import messages
from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessDispatcher
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel
from fleetops.serve import api_messages
from fleetops.serve.app import ServeConfig
from fleetops.serve.guard import CSRF_HEADER, csrf_token
from tests.servekit import InlineBackend, serving

TOKEN = "s3cret-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}", CSRF_HEADER: csrf_token(TOKEN)}
GATEWAY = {"from": "code-reviewer", "conversation_id": "conv-7", "content": "look at foo.py"}


@pytest.fixture
def fleet(store: TraceStore, tmp_path: Path) -> Fleet:
    settings = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(
        settings, store, InProcessDispatcher(), clients={"test": ScriptedModel(["done"])}
    )
    return Fleet(runtime, InlineBackend(runtime))


@pytest.fixture
def http(fleet: Fleet) -> Iterator[httpx.Client]:
    config = ServeConfig(
        store=fleet.store, actions=fleet, token=TOKEN, routes=(partial(api_messages.routes, fleet),)
    )
    with serving(config) as url, httpx.Client(base_url=url, timeout=10) as client:
        yield client


def queued(fleet: Fleet) -> Trace:
    return create_root(fleet.runtime, TaskSpec(task="work", model="test"))


def inbox_count(fleet: Fleet, trace: Trace) -> int:
    return messages.inbox(fleet.runtime).count(trace.trace_id)


def test_a_gateway_message_lands_in_the_inbox_once(fleet: Fleet, http: httpx.Client) -> None:
    trace = queued(fleet)
    path = f"/api/traces/{trace.trace_id}/messages"
    sent = http.post(path, json=GATEWAY, headers=AUTH)
    assert sent.status_code == 200, sent.text
    assert sent.json()["sent"] == trace.trace_id
    [entry] = messages.inbox(fleet.runtime).after(trace.trace_id, None, 10)
    assert (entry.posted.sender, entry.posted.conversation_id) == ("code-reviewer", "conv-7")
    assert entry.posted.content == "look at foo.py"
    assert http.get(path, headers=AUTH).status_code == 200, "the conversation is still read here"


def test_without_the_token_a_gateway_post_is_refused(fleet: Fleet, http: httpx.Client) -> None:
    trace = queued(fleet)
    path = f"/api/traces/{trace.trace_id}/messages"
    no_token = http.post(path, json=GATEWAY, headers={CSRF_HEADER: AUTH[CSRF_HEADER]})
    wrong = http.post(
        path,
        json=GATEWAY,
        headers={CSRF_HEADER: AUTH[CSRF_HEADER], "Authorization": "Bearer guess-guess-guess"},
    )
    cross = http.post(path, json=GATEWAY, headers={**AUTH, "Origin": "http://evil.example"})
    form = http.post(path, data=GATEWAY, headers=AUTH)
    # With a bearer token the token is the proof (no browser adds it): no CSRF needed, and
    # without the token the CSRF header alone is refused.
    assert (no_token.status_code, wrong.status_code) == (401, 401)
    assert (cross.status_code, form.status_code) == (403, 415)
    assert inbox_count(fleet, trace) == 0


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"content": ""}, 400),
        ({"content": "x", "from": "\x1b[2Jroot"}, 409),
        ({"content": "x", "interrupt": "yes"}, 400),
        ({"content": "x", "to": "elsewhere"}, 400),
        ({"content": "x" * (messages.MAX_MESSAGE_CHARS + 1)}, 409),
    ],
)
def test_hostile_bodies_are_refused_and_nothing_is_stored(
    fleet: Fleet, http: httpx.Client, body: dict[str, object], status: int
) -> None:
    trace = queued(fleet)
    refused = http.post(f"/api/traces/{trace.trace_id}/messages", json=body, headers=AUTH)
    assert refused.status_code == status, refused.text
    assert "\n" not in refused.json()["error"]
    assert inbox_count(fleet, trace) == 0


def test_a_message_to_an_ended_trace_is_refused(fleet: Fleet, http: httpx.Client) -> None:
    done = fleet.submit("work", model="test").trace()
    assert done.status == "completed"
    refused = http.post(f"/api/traces/{done.trace_id}/messages", json=GATEWAY, headers=AUTH)
    assert refused.status_code == 409 and "--continue" in refused.json()["error"]
    missing = http.post("/api/traces/nope-1/messages", json=GATEWAY, headers=AUTH)
    assert missing.status_code == 404
