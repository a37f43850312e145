"""`GET /api/openapi.json`: a valid OpenAPI 3.1 document, and every route answers as it says.

The document is checked by `openapi-spec-validator`; then every operation in it is called
(successes and refusals) and each answer's status must be one the operation declares and
its JSON must match the declared schema (jsonschema, the `$ref`s resolved in the document).
Every route the app serves is in the document, and every documented path is served.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from tornado.routing import PathMatches

from fleet.config.approval_rules import ApprovalRule
from fleet.conversation import approval
from fleet.inprocess import InProcessDispatcher
from fleet.llm.base import LLMResponse
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel, call, text
from fleetops.serve.app import make_app
from tests.conftest import fake_redis
from tests.servekit import LocalActions, page_config, serving

TOKEN = "openapi-test-token-0123456789"
DOC_URI = "urn:fleet-serve-openapi"


def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """`write ...` tasks write a file (a call to approve); anything else is answered."""
    if str(messages[1]["content"]).startswith("write") and messages[-1]["role"] == "user":
        return call("write_file", path="out.txt", content="x")
    return text("done")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, LocalActions]]:
    workspace = tmp_path_factory.mktemp("ws")
    settings = Settings(workspace=workspace, env={})
    model = ScriptedModel(function=respond)
    runtime = Runtime.build(
        settings, RedisStore(fake_redis()), InProcessDispatcher(), clients={"test": model}
    )
    default = replace(runtime.presets["default"], approve=(ApprovalRule("write_file"),))
    actions = LocalActions(replace(runtime, presets={**runtime.presets, "default": default}))
    config = page_config(actions, token=TOKEN, stream_block_ms=100)
    with (
        serving(config) as url,
        httpx.Client(
            base_url=url, timeout=10, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http,
    ):
        yield http, actions


@pytest.fixture(scope="module")
def document(served: tuple[httpx.Client, LocalActions]) -> dict[str, Any]:
    http, _ = served
    answer = http.get("/api/openapi.json")
    assert answer.status_code == 200
    doc: dict[str, Any] = answer.json()
    return doc


def test_the_document_is_valid_openapi(document: dict[str, Any]) -> None:
    validate(document)  # raises on any error
    assert document["openapi"].startswith("3.1")


def test_every_served_route_is_documented_and_every_documented_path_served(
    served: tuple[httpx.Client, LocalActions], document: dict[str, Any]
) -> None:
    _, actions = served
    app = make_app(page_config(actions))
    served_patterns = set()
    for rule in app.wildcard_router.rules:
        assert isinstance(rule.matcher, PathMatches)
        pattern = rule.matcher.regex.pattern
        if "static" not in pattern and pattern != "/$":
            served_patterns.add(pattern.rstrip("$"))
    documented = set()
    for path in document["paths"]:
        documented.add(re.sub(r"\{[^}]+\}", "([^/]+)", path).replace(".", r"\."))
    served_patterns = {p.replace(r"\.", ".").replace(".", r"\.") for p in served_patterns}
    actions_rule = next(p for p in served_patterns if "stop|reply|continue" in p)
    served_patterns.discard(actions_rule)
    served_patterns |= {
        actions_rule.replace("(stop|reply|continue)", name)
        for name in ("stop", "reply", "continue")
    }
    assert served_patterns == documented


def _checker(document: dict[str, Any], pointer: str) -> Draft202012Validator:
    registry: Registry[Any] = Registry().with_resource(
        DOC_URI, Resource.from_contents(document, default_specification=DRAFT202012)
    )
    return Draft202012Validator({"$ref": f"{DOC_URI}#{pointer}"}, registry=registry)


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def check(document: dict[str, Any], template: str, method: str, answer: httpx.Response) -> None:
    """The answer's status is declared for the operation and its JSON fits the schema."""
    responses = document["paths"][template][method]["responses"]
    status = str(answer.status_code)
    assert status in responses, f"{method.upper()} {template} answered {status}: {answer.text}"
    content = responses[status].get("content", {})
    if "application/json" not in content:
        return
    pointer = "/".join(
        [
            "",
            "paths",
            _escape(template),
            method,
            "responses",
            status,
            "content",
            _escape("application/json"),
            "schema",
        ]
    )
    _checker(document, pointer).validate(answer.json())


def test_every_operation_answers_as_declared(
    served: tuple[httpx.Client, LocalActions], document: dict[str, Any]
) -> None:
    http, actions = served
    done = http.post("/api/traces", json={"task": "say hi", "model": "test"}).json()["trace_id"]
    waiting = http.post("/api/traces", json={"task": "write it", "model": "test"}).json()
    pending = approval.pending(actions.store.get_trace(waiting["trace_id"])) or {}
    ids = {"trace_id": done, "waiting": waiting["trace_id"]}
    called: set[tuple[str, str]] = set()
    for method, template, path, body in calls(ids, pending):
        called.add((template, method))
        if template.endswith("/events"):
            with http.stream("GET", path) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                check(document, template, method, stream)
            continue
        answer = (
            http.request(method.upper(), path, json=body) if method == "post" else http.get(path)
        )
        check(document, template, method, answer)
    every = {(p, m) for p, item in document["paths"].items() for m in item if m != "parameters"}
    assert every - called == set(), "every documented operation is called"


def calls(ids: dict[str, str], pending: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    """(method, template, path, body) for successes and refusals of every operation."""
    done, waiting = ids["trace_id"], ids["waiting"]
    t = "/api/traces/{trace_id}"
    user = {"role": "user", "content": "more"}
    approve = {"approval_id": pending.get("tool_call_id", "x"), "digest": pending.get("digest", "")}
    return [
        ("get", "/healthz", "/healthz", None),
        ("get", "/api/session", "/api/session", None),
        ("get", "/api/openapi.json", "/api/openapi.json", None),
        ("get", "/api/traces", "/api/traces", None),
        ("get", "/api/traces", "/api/traces?status=nope", None),
        ("post", "/api/traces", "/api/traces", {"task": "x", "model": "test"}),
        ("post", "/api/traces", "/api/traces", {"task": "x", "preset": "nope"}),
        ("get", "/api/traces/running", "/api/traces/running", None),
        ("get", t, f"/api/traces/{done}", None),
        ("get", t, "/api/traces/nope-1", None),
        ("get", t + "/messages", f"/api/traces/{done}/messages?mode=main_path", None),
        ("get", t + "/messages", f"/api/traces/{done}/messages?mode=x", None),
        ("post", t + "/messages", f"/api/traces/{done}/messages", {"content": "hi"}),
        ("get", t + "/events", f"/api/traces/{done}/events", None),
        ("get", t + "/dag", f"/api/traces/{done}/dag", None),
        ("get", t + "/dag", "/api/traces/nope-1/dag", None),
        ("post", t + "/run", f"/api/traces/{done}/run", {"messages": [user]}),
        ("post", t + "/run", f"/api/traces/{done}/run", {"messages": []}),
        ("post", t + "/run", f"/api/traces/{waiting}/run", {"messages": [user]}),
        ("post", t + "/reflect", f"/api/traces/{done}/reflect", {"focus": "why", "model": "test"}),
        ("post", t + "/reflect", f"/api/traces/{waiting}/reflect", {}),
        ("post", t + "/compact", f"/api/traces/{done}/compact", {}),  # too short: 409
        ("post", t + "/compact", f"/api/traces/{done}/compact", {"x": 1}),
        ("post", t + "/reply", f"/api/traces/{done}/reply", {"answer": "x"}),
        ("post", t + "/continue", f"/api/traces/{done}/continue", {"message": "again"}),
        ("get", "/api/approvals", "/api/approvals", None),
        (
            "post",
            t + "/deny",
            f"/api/traces/{waiting}/deny",
            {**approve, "digest": "0" * 64, "reason": "no"},
        ),
        ("post", t + "/approve", f"/api/traces/{waiting}/approve", approve),
        ("post", t + "/stop", f"/api/traces/{done}/stop", {}),
        ("get", "/api/experiences", "/api/experiences", None),
        (
            "post",
            "/api/experiences",
            "/api/experiences",
            {"scope": "agent:default", "condition": "when x", "rule": "then y"},
        ),
        ("get", "/api/experiences/{experience_id}", "/api/experiences/exp-none", None),
        (
            "post",
            "/api/experiences/{experience_id}/approve",
            "/api/experiences/exp-none/approve",
            {},
        ),
        ("post", "/api/experiences/{experience_id}/remove", "/api/experiences/exp-none/remove", {}),
        ("get", "/api/memory", "/api/memory", None),
        (
            "post",
            "/api/memory/{namespace}/{key}",
            "/api/memory/user:alice/colour",
            {"value": "red"},
        ),
        ("get", "/api/memory/{namespace}", "/api/memory/user:alice", None),
        ("get", "/api/memory/{namespace}/{key}", "/api/memory/user:alice/colour", None),
        (
            "get",
            "/api/memory/{namespace}/{key}/history",
            "/api/memory/user:alice/colour/history",
            None,
        ),
        ("post", "/api/memory/{namespace}/approve", "/api/memory/user:alice/approve", {}),
        (
            "post",
            "/api/memory/{namespace}/{key}/remove",
            "/api/memory/user:alice/colour/remove",
            {},
        ),
    ]


def test_the_document_is_behind_the_token(served: tuple[httpx.Client, LocalActions]) -> None:
    http, _ = served
    assert (
        httpx.get(f"{http.base_url}/api/openapi.json".replace("//api", "/api")).status_code == 401
    )
