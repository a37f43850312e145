"""The OpenAPI 3.1 document of `fleet serve` (`GET /api/openapi.json`).

Request bodies of the control API are the pydantic models that parse them
(`fleetops.serve.submission`), so the document cannot drift from what is accepted; the
answers are written here, and `tests/test_serve_openapi.py` calls every route and checks
its status and JSON against what is declared (and the document against
`openapi-spec-validator`).
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic.json_schema import models_json_schema

from fleetops.serve.openapi_schemas import BOOL, INT, LIST, OBJECT, REF, SCHEMAS, STR, obj
from fleetops.serve.submission import CompactBody, ReflectBody, RunBody, SubmitBody

JSON = "application/json"
ERRORS = {
    "400": "the id, a query argument or a field is malformed",
    "401": "the bearer token is missing or wrong (a service started with FLEET_SERVE_TOKEN)",
    "403": "another origin or site, a foreign Host, or no CSRF token (a token-less service)",
    "404": "no such trace (or entry)",
    "409": "the trace is not in a state for this (running, answered already, not finished)",
    "413": "the body is over 64 KiB",
    "415": "the body is not application/json",
    "422": "a field does not fit: `field` names it, nothing was written",
    "503": "Redis or the broker is unreachable: nothing was done",
}


def _answers(ok: str, schema: str | None, *errors: str) -> dict[str, Any]:
    """`ok` with `schema` (JSON), then each error status with the Error schema."""
    out: dict[str, Any] = {ok: {"description": "done"}}
    if schema is not None:
        out[ok]["content"] = {JSON: {"schema": {"$ref": REF.format(model=schema)}}}
    error = {JSON: {"schema": {"$ref": REF.format(model="Error")}}}
    for status in ("401", "503", *errors):
        out[status] = {"description": ERRORS[status], "content": error}
    return out


def _inline(ok: str, schema: dict[str, Any], *errors: str) -> dict[str, Any]:
    out = _answers(ok, None, *errors)
    out[ok]["content"] = {JSON: {"schema": schema}}
    return out


def _body(model: str) -> dict[str, Any]:
    schema = {"$ref": REF.format(model=model)}
    return {"required": True, "content": {JSON: {"schema": schema}}}


def _free_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": schema}}}


POSTED = ("403", "413", "415")
ID = {"name": "trace_id", "in": "path", "required": True, "schema": STR}


def _trace_paths() -> dict[str, Any]:
    mode = {"name": "mode", "in": "query", "schema": {"enum": ["all", "main_path"]}}
    on_trace = ("400", "404")
    return {
        "/api/traces": {
            "get": {
                "summary": "List traces (filters: status, root, waiting, model, preset,"
                " q, roots, cursor, limit)",
                "responses": _answers("200", "TraceList", "400"),
            },
            "post": {
                "summary": "Submit a root (a task, or `explore`: a list of tasks)",
                "requestBody": _body("SubmitBody"),
                "responses": _answers("202", "Started", *POSTED, "400", "422"),
            },
        },
        "/api/traces/running": {
            "get": {
                "summary": "Every trace that has not ended",
                "responses": _answers("200", "TraceList", "400"),
            }
        },
        "/api/traces/{trace_id}": {
            "parameters": [ID],
            "get": {
                "summary": "A trace, its children and collaborators",
                "responses": _answers("200", "TraceDetail", *on_trace),
            },
        },
        "/api/traces/{trace_id}/messages": {
            "parameters": [ID],
            "get": {
                "summary": "The messages: every branch, or the main path",
                "parameters": [mode],
                "responses": _answers("200", "Messages", *on_trace),
            },
            "post": {
                "summary": "Message a running trace (`fleet send`)",
                "requestBody": _free_body(
                    obj({"content": STR}, **{"from": STR}, conversation_id=STR, interrupt=BOOL)
                ),
                "responses": _inline(
                    "200", obj({"sent": STR, "entry_id": STR}), *POSTED, *on_trace, "409"
                ),
            },
        },
        "/api/traces/{trace_id}/dag": {
            "parameters": [ID],
            "get": {
                "summary": "The plan as a graph: goals with their messages and sub-agents,"
                " abandoned and rewound ones greyed, the branches",
                "responses": _answers("200", "Dag", *on_trace),
            },
        },
        "/api/traces/{trace_id}/events": {
            "parameters": [ID],
            "get": {
                "summary": "The tree's events as Server-Sent Events (resumable: Last-Event-ID)",
                "responses": {
                    **_answers("200", None, *on_trace),
                    "200": {
                        "description": "the stream",
                        "content": {"text/event-stream": {"schema": STR}},
                    },
                },
            },
        },
        "/api/traces/{trace_id}/run": {
            "parameters": [ID],
            "post": {
                "summary": "Continue a finished root; with after_sequence a rewind; with"
                " after_sequence and no message a regenerate",
                "requestBody": _body("RunBody"),
                "responses": _answers("202", "Started", *POSTED, *on_trace, "409", "422"),
            },
        },
        "/api/traces/{trace_id}/compact": {
            "parameters": [ID],
            "post": {
                "summary": "Summarise a finished root's main path through a side branch (the"
                " originals stay; a rewind into them undoes it)",
                "requestBody": _body("CompactBody"),
                "responses": _answers("200", "Compacted", *POSTED, *on_trace, "409", "422"),
            },
        },
        "/api/traces/{trace_id}/reflect": {
            "parameters": [ID],
            "post": {
                "summary": "A read-only reflection over the finished tree (`focus`)",
                "requestBody": _body("ReflectBody"),
                "responses": _answers("202", "Reflecting", *POSTED, *on_trace, "409", "422"),
            },
        },
    }


def _action_paths() -> dict[str, Any]:
    on_trace = (*POSTED, "400", "404", "409")
    text = obj({"answer": STR})
    return {
        "/api/traces/{trace_id}/stop": {
            "parameters": [ID],
            "post": {
                "summary": "Stop the trace and its subtree",
                "responses": _inline(
                    "200", obj({"stopped": {"type": "array", "items": STR}}), *on_trace
                ),
            },
        },
        "/api/traces/{trace_id}/reply": {
            "parameters": [ID],
            "post": {
                "summary": "Answer the trace's question",
                "requestBody": _free_body(text),
                "responses": _inline("200", obj({"replied": STR}), *on_trace),
            },
        },
        "/api/traces/{trace_id}/continue": {
            "parameters": [ID],
            "post": {
                "summary": "The page's continue (one message; `run` is the API's)",
                "requestBody": _free_body(obj({"message": STR}, after_sequence=INT)),
                "responses": _inline("200", obj({"continued": STR}), *on_trace),
            },
        },
        "/api/traces/{trace_id}/approve": {
            "parameters": [ID],
            "post": {
                "summary": "Approve the tool call the trace waits on (as shown: its digest)",
                "requestBody": _free_body(obj({"approval_id": STR, "digest": STR})),
                "responses": _inline("200", obj({"approved": STR, "approval_id": STR}), *on_trace),
            },
        },
        "/api/traces/{trace_id}/deny": {
            "parameters": [ID],
            "post": {
                "summary": "Deny it: nothing runs, the model reads the reason",
                "requestBody": _free_body(obj({"approval_id": STR, "digest": STR, "reason": STR})),
                "responses": _inline("200", obj({"denied": STR, "approval_id": STR}), *on_trace),
            },
        },
        "/api/approvals": {
            "get": {
                "summary": "Tool calls waiting for a person",
                "responses": _inline("200", obj({"approvals": LIST}), "400"),
            },
        },
    }


def _side_paths() -> dict[str, Any]:
    """Experiences and memory (their own modules say every field)."""
    name = {"in": "path", "required": True, "schema": STR}
    exp, ns, key = ({"name": n, **name} for n in ("experience_id", "namespace", "key"))
    one = _inline("200", obj({"experience": OBJECT}), "400", "404")
    posted = (*POSTED, "400", "404")
    return {
        "/healthz": {
            "get": {
                "summary": "The process answers (no token)",
                "responses": {
                    "200": {"description": "up", "content": {JSON: {"schema": obj({"ok": BOOL})}}}
                },
            }
        },
        "/api/session": {
            "get": {
                "summary": "The CSRF token of a token-less service's page",
                "responses": _inline("200", obj({"csrf": STR, "token_required": BOOL})),
            }
        },
        "/api/openapi.json": {
            "get": {"summary": "This document", "responses": _inline("200", OBJECT)}
        },
        "/api/experiences": {
            "get": {
                "summary": "Experiences",
                "responses": _inline("200", obj({"experiences": LIST}), "400"),
            },
            "post": {
                "summary": "Add one",
                "requestBody": _free_body(OBJECT),
                "responses": _inline("201", obj({"experience": OBJECT}), *posted),
            },
        },
        "/api/experiences/{experience_id}": {
            "parameters": [exp],
            "get": {"summary": "One experience", "responses": one},
        },
        "/api/experiences/{experience_id}/approve": {
            "parameters": [exp],
            "post": {
                "summary": "Approve it",
                "responses": _inline("200", obj({"experience": OBJECT}), *posted),
            },
        },
        "/api/experiences/{experience_id}/remove": {
            "parameters": [exp],
            "post": {
                "summary": "Remove it",
                "responses": _inline("200", obj({"removed": STR}), *posted),
            },
        },
        "/api/memory": {
            "get": {
                "summary": "Memory namespaces",
                "responses": _inline("200", obj({"namespaces": LIST})),
            }
        },
        "/api/memory/{namespace}": {
            "parameters": [ns],
            "get": {
                "summary": "A namespace's entries",
                "responses": _inline("200", obj({"entries": LIST, "held": LIST}), "400"),
            },
        },
        "/api/memory/{namespace}/approve": {
            "parameters": [ns],
            "post": {
                "summary": "Approve held writes",
                "responses": _inline("200", obj({"approved": LIST}), *posted),
            },
        },
        "/api/memory/{namespace}/{key}": {
            "parameters": [ns, key],
            "get": {
                "summary": "One entry",
                "responses": _inline("200", obj({"entry": OBJECT}), "400", "404"),
            },
            "post": {
                "summary": "Set it (compare-and-set with expected_version)",
                "requestBody": _free_body(OBJECT),
                "responses": _inline("200", obj({"version": INT}), *posted, "409"),
            },
        },
        "/api/memory/{namespace}/{key}/history": {
            "parameters": [ns, key],
            "get": {
                "summary": "Its versions",
                "responses": _inline("200", obj({"history": LIST}), "400", "404"),
            },
        },
        "/api/memory/{namespace}/{key}/remove": {
            "parameters": [ns, key],
            "post": {
                "summary": "Remove it",
                "responses": _inline("200", obj({"removed": STR}), *posted),
            },
        },
    }


@functools.cache
def document() -> dict[str, Any]:
    """The whole document: paths, the request models' schemas, the answers' schemas."""
    models = [(m, "validation") for m in (SubmitBody, RunBody, ReflectBody, CompactBody)]
    _, generated = models_json_schema(models, ref_template=REF)  # type: ignore[arg-type]
    schemas = {**generated.get("$defs", {}), **SCHEMAS}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fleet serve",
            "version": "1",
            "description": "Submit, run and watch agent trees (docs/api.md). Send"
            " `Authorization: Bearer $FLEET_SERVE_TOKEN` on every /api/ call.",
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {**_trace_paths(), **_action_paths(), **_side_paths()},
    }
