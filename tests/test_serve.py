"""`fleet serve`: the trace API over every store, SSE resume, auth and its attacks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessDispatcher
from fleet.loop.runner import Runner
from fleet.models import Collaborator, Event, Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleetops.serve.app import ServeConfig
from tests.fleetkit import explore_script
from tests.servekit import LocalActions, csrf, read_sse, serving

TOKEN = "s3cret-token-for-tests-0123456789"
HOSTILE = "<img src=x onerror=alert(1)>"


def explored(store: TraceStore, tmp_path: Path, branches: int = 3) -> Trace:
    """A finished explore of `branches` branches, run in this process."""
    model = explore_script(tmp_path / "model.yaml", branches)
    settings = Settings(workspace=tmp_path, allow_scripted=True)
    runtime = Runtime.build(settings, store, InProcessDispatcher())
    root = create_root(runtime, TaskSpec(f"survey {HOSTILE}", model))
    Runner(runtime).run(root.trace_id)
    return store.get_trace(root.trace_id)


def config(store: TraceStore, token: str | None = None) -> ServeConfig:
    runtime = Runtime.build(Settings(), store, InProcessDispatcher())
    return ServeConfig(store=store, actions=LocalActions(runtime), token=token, stream_block_ms=200)


@pytest.fixture
def api(store: TraceStore) -> Iterator[httpx.Client]:
    with serving(config(store)) as url, httpx.Client(base_url=url, timeout=10) as http:
        yield http


def test_list_detail_and_messages_of_an_explore(
    api: httpx.Client, store: TraceStore, tmp_path: Path
) -> None:
    root = explored(store, tmp_path)
    children = store.children(root.trace_id)
    listed = api.get("/api/traces", params={"root": root.trace_id}).json()["traces"]
    assert [t["trace_id"] for t in listed] == [root.trace_id, *children]
    assert {t["status"] for t in listed} == {"completed"}
    failed = api.get("/api/traces", params={"status": "failed"}).json()
    assert failed == {"traces": [], "next": None}
    assert len(api.get("/api/traces", params={"status": "completed"}).json()["traces"]) == 4
    detail = api.get(f"/api/traces/{root.trace_id}").json()
    assert detail["trace"]["task"] == root.task and detail["trace"]["last_tool"] == "agent"
    assert detail["trace"]["stats"]["prompt_tokens"] == root.stats.prompt_tokens > 0
    assert [c["trace_id"] for c in detail["children"]] == children
    assert [c["status"] for c in detail["collaborators"]] == ["completed"] * 3
    assert detail["collaborators"][0]["summary"].startswith("done: Branch 1")
    messages = api.get(f"/api/traces/{children[0]}/messages").json()["messages"]
    assert [m["sequence"] for m in messages] == [m.sequence for m in store.messages(children[0])]
    assert messages[-1]["content"].startswith("done: Branch 1")


def test_waiting_lists_only_traces_waiting_on_a_person(
    api: httpx.Client, store: TraceStore, tmp_path: Path
) -> None:
    explored(store, tmp_path, branches=1)
    entries = {
        "t-human": Collaborator(name="you", type="human", trace_id="t-human@h", status="waiting"),
        "t-agents": Collaborator(name="a", type="agent", trace_id="t-agents@a", status="running"),
    }
    for trace_id, entry in entries.items():
        store.create_trace(Trace(trace_id=trace_id, root_trace_id=trace_id, task="x"))
        store.update_trace(trace_id, status="waiting")
        store.put_collaborator(trace_id, entry)
    store.index_human_wait("t-human", 10**13)  # as every wait on a person is indexed
    waiting = api.get("/api/traces", params={"waiting": "1"}).json()["traces"]
    assert [t["trace_id"] for t in waiting] == ["t-human"]
    both = api.get("/api/traces", params={"status": "waiting"}).json()["traces"]
    assert {t["trace_id"] for t in both} == {"t-human", "t-agents"}


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/traces/no-such-trace", 404, "no trace 'no-such-trace'"),
        ("/api/traces/bad%20id%3Cx%3E", 400, "invalid trace id"),
        ("/api/traces/..%2F..%2Fetc", 400, "invalid trace id"),
        ("/api/traces?status=bogus", 400, "status 'bogus'"),
        ("/api/traces?limit=0", 400, "limit '0'"),
        ("/api/traces?root=a%0Ab", 400, "invalid trace id"),
        ("/api/traces?sort=x", 400, "unknown query argument"),
        ("/api/traces/no-such-trace/messages", 404, "no trace"),
        ("/api/traces/no-such-trace/events", 404, "no trace"),
    ],
)
def test_bad_requests_get_a_one_line_json_error(
    api: httpx.Client, path: str, status: int, says: str
) -> None:
    response = api.get(path)
    assert response.status_code == status
    assert says in response.json()["error"]


def test_a_bad_last_event_id_is_refused(
    api: httpx.Client, store: TraceStore, tmp_path: Path
) -> None:
    root = explored(store, tmp_path, branches=1)
    response = api.get(f"/api/traces/{root.trace_id}/events", headers={"Last-Event-ID": "0-0;DROP"})
    assert response.status_code == 400 and "Last-Event-ID" in response.json()["error"]


def test_stop_stops_the_subtree(api: httpx.Client, store: TraceStore) -> None:
    store.create_trace(Trace(trace_id="r1", root_trace_id="r1", task="x"))
    store.create_trace(Trace(trace_id="r1@c", root_trace_id="r1", parent_trace_id="r1", task="y"))
    headers = csrf(api)
    assert api.post("/api/traces/r1/stop", headers=headers).json() == {"stopped": ["r1", "r1@c"]}
    assert store.get_trace("r1@c").status == "stopped" and store.stop_requested("r1@c")
    assert api.post("/api/traces/nope/stop", headers=headers).status_code == 404


def test_sse_resumes_after_a_reconnect_without_losing_an_event(
    api: httpx.Client, store: TraceStore
) -> None:
    store.create_trace(Trace(trace_id="sse", root_trace_id="sse", task="x"))
    for i in range(3):
        store.emit("sse", Event(kind="trace", trace_id="sse", data={"n": i}))
    url = "/api/traces/sse/events"
    with api.stream("GET", url) as first:
        assert first.headers["content-type"].startswith("text/event-stream")
        got = read_sse(first, 2)  # then the connection drops mid-stream
    for i in range(3, 6):  # written while nobody listens
        store.emit("sse", Event(kind="trace", trace_id="sse", data={"n": i}))
    with api.stream("GET", url, headers={"Last-Event-ID": str(got[-1].id)}) as second:
        got += read_sse(second, 4)
    with api.stream("GET", url, headers={"Last-Event-ID": str(got[-1].id)}) as third:
        store.emit("sse", Event(kind="finish", trace_id="sse", data={"n": 6}))
        got += read_sse(third, 1)  # a live one, after the reconnect
    stored = store.read_events("sse")
    assert [e.id for e in got] == [entry_id for entry_id, _ in stored]
    assert [e.data["data"]["n"] for e in got] == list(range(7))
    assert got[-1].event == "finish"


def test_model_text_in_the_api_stays_data(
    api: httpx.Client, store: TraceStore, tmp_path: Path
) -> None:
    root = explored(store, tmp_path, branches=1)
    response = api.get(f"/api/traces/{root.trace_id}")
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.json()["trace"]["task"].endswith(HOSTILE)
    page = api.get("/")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "<script>" not in page.text  # no inline script: the CSP forbids it anyway
    for name in ("app", "util", "front", "tree", "timeline", "conversation", "actions"):
        script = api.get(f"/static/{name}.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in script.text, (name, sink)


# -- auth ------------------------------------------------------------------------------


def test_with_a_token_the_api_needs_it(store: TraceStore) -> None:
    store.create_trace(Trace(trace_id="t1", root_trace_id="t1", task="x"))
    with serving(config(store, TOKEN)) as url, httpx.Client(base_url=url, timeout=10) as http:
        for path in ("/api/traces", "/api/traces/t1", "/api/traces/t1/events"):
            refused = http.get(path)
            assert refused.status_code == 401 and "bearer token" in refused.json()["error"]
            assert refused.headers["www-authenticate"].startswith("Bearer")
            wrong = http.get(path, headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})
            assert wrong.status_code == 401
        assert http.post("/api/traces/t1/stop").status_code == 401
        assert http.get("/api/session").status_code == 401  # the CSRF token is behind it too
        assert not store.stop_requested("t1")
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert http.get("/api/traces/t1", headers=good).json()["trace"]["trace_id"] == "t1"
        assert http.get("/").status_code == 200  # the page itself holds no data
        assert http.get("/healthz").json() == {"ok": True}  # nor do probes


def test_without_a_token_a_foreign_host_is_refused(api: httpx.Client, store: TraceStore) -> None:
    store.create_trace(Trace(trace_id="t2", root_trace_id="t2", task="x"))
    # DNS rebinding: a page at attacker.example whose name now resolves to 127.0.0.1.
    rebound = api.get("/api/traces/t2", headers={"Host": "attacker.example:8600"})
    assert rebound.status_code == 403
    assert api.get("/api/traces/t2", headers={"Host": "localhost:8600"}).status_code == 200
    headers = csrf(api) | {"Origin": "http://attacker.example"}
    cross = api.post("/api/traces/t2/stop", headers=headers)
    assert cross.status_code == 403 and not store.stop_requested("t2")


def serve_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "FLEET_SERVE_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "serve", *args],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (("--address", "0.0.0.0"), {}, "would be open to the network: set FLEET_SERVE_TOKEN"),
        (("--address", "0.0.0.0"), {"FLEET_SERVE_TOKEN": "short"}, "at least 16 characters"),
    ],
)
def test_serve_refuses_to_listen_beyond_loopback_without_a_real_token(
    args: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    done = serve_cli(*args, **env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: error: ")
    assert says in done.stderr and "Traceback" not in done.stderr


def test_an_unreachable_redis_is_a_503_that_names_no_url() -> None:
    store = RedisStore.from_url("redis://:hunter2-password@127.0.0.1:1/0")
    with serving(config(store)) as url, httpx.Client(base_url=url, timeout=30) as http:
        for path in ("/api/traces", "/api/traces/t1", "/api/traces/t1/events"):
            response = http.get(path)
            assert response.status_code == 503, path
            assert response.json() == {"error": "the trace store (Redis) is unreachable"}
