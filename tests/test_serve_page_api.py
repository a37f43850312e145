"""`fleet serve`'s list filters and cursor, its budget detail, and the page's actions.

Actions run through `LocalActions` (the trace runs on in this process), over every store;
approve and deny through `api_approvals` over a `Fleet` with an inline backend.
Attack tests sit beside each action: no CSRF token, a wrong one, another origin, a
cross-site fetch, a second answer, a malformed body.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fleet.config.approval_rules import ApprovalRule
from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessDispatcher
from fleet.limits.budget import Budget
from fleet.llm.base import LLMResponse
from fleet.models import Collaborator, Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.root_index import ROOTS
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text
from fleetops.serve.app import ServeConfig
from tests.servekit import LocalActions, csrf, page_config, serving

HOSTILE = "<script>document.title='pwned'</script>\x1b[31mred\x1b[0m"


def asker(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Asks a person first, then answers with what the person said."""
    if not any(m["role"] == "tool" for m in messages):
        return call("ask_human", question=f"Which colour? {HOSTILE}")
    return text(f"painted it {messages[-1]['content']}")


def writer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Writes a file once (a call that needs approval), then says what the tool said."""
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        return call("write_file", call_id="w1", path="out.txt", content="written")
    return text(f"tool said: {results[-1]['content']}")


def local(store: TraceStore, workspace: Path, model: ScriptedModel) -> LocalActions:
    settings = Settings(workspace=workspace, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": model})
    default = replace(runtime.presets["default"], approve=(ApprovalRule("write_file"),))
    return LocalActions(replace(runtime, presets={**runtime.presets, "default": default}))


@pytest.fixture
def served(store: TraceStore, tmp_path: Path) -> Iterator[tuple[httpx.Client, LocalActions]]:
    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        first = str(messages[1]["content"]) if len(messages) > 1 else ""
        return (writer if first.startswith("write") else asker)(messages, tools)

    actions = local(store, tmp_path, ScriptedModel(function=respond))
    config = page_config(actions, stream_block_ms=200)
    with serving(config) as url, httpx.Client(base_url=url, timeout=10) as http:
        yield http, actions


def post(http: httpx.Client, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return http.post(path, json=body or {}, headers=csrf(http))


# -- the list --------------------------------------------------------------------------


def make_trace(store: TraceStore, trace_id: str, created_ms: int, **fields: Any) -> None:
    root = fields.pop("root", trace_id)
    store.create_trace(
        Trace(trace_id=trace_id, root_trace_id=root, created_at_ms=created_ms, **fields)
    )
    if root == trace_id:  # as `create_root` indexes every root it creates
        store.capability(ROOTS).add(trace_id, created_ms)


def test_the_list_filters_by_waiting_model_preset_and_text(
    served: tuple[httpx.Client, LocalActions], store: TraceStore
) -> None:
    http, _ = served
    make_trace(store, "a-person", 1000, task="paint", model="m1", status="waiting")
    make_trace(store, "b-approval", 2000, task="write", model="m2", preset="coder")
    store.update_trace("b-approval", status="waiting")
    make_trace(store, "c-done", 3000, task="Survey the SHED", model="m1", status="completed")
    person = Collaborator(name="you", type="human", trace_id="human:1", status="waiting")
    approval = Collaborator(name="approval", type="approval", trace_id="human:2", status="waiting")
    store.put_collaborator("a-person", person)
    store.put_collaborator("b-approval", approval)
    for waiting in ("a-person", "b-approval"):  # as every wait on a person is indexed
        store.index_human_wait(waiting, 10**13)

    def ids(**params: str) -> list[str]:
        response = http.get("/api/traces", params=params)
        assert response.status_code == 200, response.text
        return [t["trace_id"] for t in response.json()["traces"]]

    assert ids(waiting="person") == ["a-person"]
    assert ids(waiting="approval") == ["b-approval"]
    assert ids(waiting="any") == ["b-approval", "a-person"]
    assert ids(waiting="1") == ["b-approval", "a-person"]  # the old spelling
    assert ids(model="m1") == ["c-done", "a-person"]
    assert ids(preset="coder") == ["b-approval"]
    assert ids(q="shed") == ["c-done"]
    assert ids(q="<script>") == []
    waiting = http.get("/api/traces", params={"waiting": "any"}).json()["traces"]
    assert [t["waiting_on"] for t in waiting] == ["approval", "person"]


def test_roots_carry_their_tree_totals_and_the_cursor_pages_without_overlap(
    served: tuple[httpx.Client, LocalActions], store: TraceStore
) -> None:
    http, _ = served
    for i in range(5):
        make_trace(store, f"r{i}", 1000 + i, task="t")
        store.add_stats(f"r{i}", prompt_tokens=10, cost_usd=0.5)
    for j in range(3):
        make_trace(store, f"r4@c{j}", 2000 + j, task="c", root="r4", parent_trace_id="r4")
        store.add_stats(f"r4@c{j}", completion_tokens=5, cost_usd=0.25)
    seen: list[str] = []
    cursor = ""
    for _ in range(5):
        params = {"roots": "1", "limit": "2"} | ({"cursor": cursor} if cursor else {})
        body = http.get("/api/traces", params=params).json()
        seen += [t["trace_id"] for t in body["traces"]]
        if body["next"] is None:
            break
        cursor = body["next"]
    assert seen == ["r4", "r3", "r2", "r1", "r0"]  # roots only, each once, newest first
    top = http.get("/api/traces", params={"roots": "1", "limit": "1"}).json()["traces"][0]
    assert top["branches"] == 3
    assert top["tree_stats"] == {"prompt_tokens": 10, "completion_tokens": 15, "cost_usd": 1.25}


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"cursor": "12~a b"}, "cursor '12~a b'"),
        ({"cursor": "x"}, "cursor 'x'"),
        ({"waiting": "maybe"}, "waiting 'maybe'"),
        ({"roots": "yes"}, "roots 'yes'"),
        ({"q": "x" * 300}, "q is longer than"),
    ],
)
def test_bad_list_arguments_are_one_line_400s(
    served: tuple[httpx.Client, LocalActions], query: dict[str, str], says: str
) -> None:
    http, _ = served
    response = http.get("/api/traces", params=query)
    assert response.status_code == 400 and says in response.json()["error"]


def test_a_root_with_a_budget_shows_limit_used_and_reserved(
    redis_db: redis.Redis, tmp_path: Path
) -> None:
    store = RedisStore(redis_db)
    actions = local(store, tmp_path, ScriptedModel([text("done")]))
    spec = TaskSpec("t", model="test", budget=Budget(tokens=50_000, usd=2.0))
    root = create_root(actions.runtime, spec)
    config = page_config(actions)
    with serving(config) as url, httpx.Client(base_url=url, timeout=10) as http:
        budget = http.get(f"/api/traces/{root.trace_id}").json()["budget"]
    assert budget["limit"]["tokens"] == 50_000 and budget["limit"]["usd"] == 2.0
    assert budget["used"] == {"tokens": 0, "usd": 0.0, "sub_agents": 0}
    assert set(budget["reserved"]) == {"tokens", "usd"}


# -- actions ---------------------------------------------------------------------------


def test_a_reply_from_the_api_resumes_the_trace_once(
    served: tuple[httpx.Client, LocalActions], store: TraceStore
) -> None:
    http, actions = served
    trace = actions.run("paint the shed", model="test")
    assert trace.status == "waiting"
    detail = http.get(f"/api/traces/{trace.trace_id}").json()
    assert detail["trace"]["run"]["waiting_on"]["question"].endswith(HOSTILE)
    done = post(http, f"/api/traces/{trace.trace_id}/reply", {"answer": "green"})
    assert done.json() == {"replied": trace.trace_id}
    assert store.get_trace(trace.trace_id).answer == "painted it green"
    again = post(http, f"/api/traces/{trace.trace_id}/reply", {"answer": "blue"})
    assert again.status_code == 409 and "not waiting on a person" in again.json()["error"]
    assert store.get_trace(trace.trace_id).answer == "painted it green"


def test_approve_and_deny_answer_once_through_the_approval_endpoints(
    served: tuple[httpx.Client, LocalActions], store: TraceStore, tmp_path: Path
) -> None:
    http, actions = served
    first = actions.run("write it", model="test")
    second = actions.run("write that", model="test")
    assert first.status == second.status == "waiting"
    assert first.run.waiting_on is not None and second.run.waiting_on is not None
    call_id = first.run.waiting_on["tool_call_id"]
    digest = first.run.waiting_on["digest"]
    forged = post(
        http, f"/api/traces/{first.trace_id}/approve", {"approval_id": "call_x", "digest": digest}
    )
    assert forged.status_code == 409 and "is not the call" in forged.json()["error"]
    bare = post(http, f"/api/traces/{first.trace_id}/approve", {"approval_id": call_id})
    assert bare.status_code == 400 and "'digest'" in bare.json()["error"]
    body = {"approval_id": call_id, "digest": digest}
    ok = post(http, f"/api/traces/{first.trace_id}/approve", body)
    assert ok.status_code == 200 and (tmp_path / "out.txt").read_text() == "written"
    twice = post(http, f"/api/traces/{first.trace_id}/approve", body)
    assert twice.status_code == 409
    other = second.run.waiting_on["tool_call_id"]
    body = {"approval_id": other, "digest": second.run.waiting_on["digest"]}
    body["reason"] = "not today"
    assert post(http, f"/api/traces/{second.trace_id}/deny", body).status_code == 200
    assert "not today" in (store.get_trace(second.trace_id).answer or "")
    assert post(http, f"/api/traces/{second.trace_id}/deny", body).status_code == 409


def test_continue_a_finished_root_from_the_api(
    served: tuple[httpx.Client, LocalActions], store: TraceStore
) -> None:
    http, actions = served
    trace = actions.run("paint the shed", model="test")
    actions.reply(trace.trace_id, "green")
    done = post(http, f"/api/traces/{trace.trace_id}/continue", {"message": "and the door?"})
    assert done.status_code == 200, done.text
    users = [m.content for m in store.messages(trace.trace_id) if m.role == "user"]
    assert users[-1] == "and the door?"
    messages = http.get(f"/api/traces/{trace.trace_id}/messages").json()
    assert messages["head_sequence"] == store.get_trace(trace.trace_id).head_sequence
    assert [b["main"] for b in messages["branches"]] == [True]


def test_an_action_without_the_csrf_token_or_from_elsewhere_is_refused(
    served: tuple[httpx.Client, LocalActions], store: TraceStore
) -> None:
    http, actions = served
    trace = actions.run("paint the shed", model="test")
    url = f"/api/traces/{trace.trace_id}/reply"
    body = {"answer": "green"}
    token = csrf(http)
    refused = [
        http.post(url, json=body),
        http.post(url, json=body, headers={"X-Fleet-CSRF": "forged-" + "x" * 30}),
        http.post(url, json=body, headers=token | {"Origin": "http://evil.example"}),
        http.post(url, json=body, headers=token | {"Sec-Fetch-Site": "cross-site"}),
        http.post(url, json=body, headers=token | {"Host": "evil.example"}),
    ]
    assert [r.status_code for r in refused] == [403] * 5
    assert "X-Fleet-CSRF" in refused[0].json()["error"]
    assert store.get_trace(trace.trace_id).status == "waiting", "nothing was answered"
    same = http.post(url, json=body, headers=token | {"Origin": str(http.base_url).rstrip("/")})
    assert same.status_code == 200


@pytest.mark.parametrize(
    ("action", "body", "says"),
    [
        ("reply", b"{not json", "not JSON"),
        ("reply", b"[1]", "must be a JSON object"),
        ("reply", b"{}", "missing field(s) ['answer']"),
        ("reply", b'{"answer": 5}', "answer must be a string"),
        ("reply", b'{"answer": "x", "as_admin": true}', "unknown field(s) ['as_admin']"),
        ("continue", b'{"message": "x", "after_sequence": -1}', "non-negative integer"),
        ("continue", b'{"message": "x", "after_sequence": true}', "non-negative integer"),
    ],
)
def test_a_bad_action_body_is_a_400_and_changes_nothing(
    served: tuple[httpx.Client, LocalActions],
    store: TraceStore,
    action: str,
    body: bytes,
    says: str,
) -> None:
    http, actions = served
    trace = actions.run("paint the shed", model="test")
    before = store.get_trace(trace.trace_id)
    response = http.post(f"/api/traces/{trace.trace_id}/{action}", content=body, headers=csrf(http))
    assert response.status_code == 400 and says in response.json()["error"]
    assert store.get_trace(trace.trace_id) == before


def test_with_a_bearer_token_replicas_share_the_csrf_token_and_it_is_not_the_bearer(
    store: TraceStore, tmp_path: Path
) -> None:
    token = "s3cret-token-for-tests-0123456789"
    actions = local(store, tmp_path, ScriptedModel())
    store.create_trace(Trace(trace_id="t1", root_trace_id="t1", task="x"))
    one, two = (ServeConfig(store=store, actions=actions, token=token) for _ in range(2))
    assert one.csrf == two.csrf and token not in one.csrf
    loopback = ServeConfig(store=store, actions=actions)
    assert loopback.csrf != ServeConfig(store=store, actions=actions).csrf  # random per process
    bearer = {"Authorization": f"Bearer {token}"}
    with serving(one) as url, httpx.Client(base_url=url, timeout=10, headers=bearer) as http:
        assert http.get("/api/session").json() == {"csrf": one.csrf, "token_required": True}
        stopped = http.post("/api/traces/t1/stop", headers={"X-Fleet-CSRF": two.csrf})
        assert stopped.json() == {"stopped": ["t1"]}
