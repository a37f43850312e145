"""The answers' schemas of `fleet serve`'s OpenAPI document (`fleetops.serve.openapi`)."""

from __future__ import annotations

from typing import Any

REF = "#/components/schemas/{model}"


def obj(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """An object schema: `required` properties, more `optional` ones, others allowed."""
    return {"type": "object", "required": sorted(required), "properties": required | optional}


STR, INT, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
OBJECT, LIST = {"type": "object"}, {"type": "array"}
MAYBE_STR = {"type": ["string", "null"]}
SCHEMAS: dict[str, Any] = {
    "Error": obj({"error": STR}, field=STR),
    "Started": obj(
        {"trace_id": STR, "status": {"const": "started"}, "turn": INT},
        run={"enum": ["continue", "rewind", "regenerate"]},
    ),
    "Reflecting": obj(
        {"trace_id": STR, "status": {"const": "started"}, "reflection_trace_id": STR, "scope": STR}
    ),
    "Compacted": obj(
        {
            "trace_id": STR,
            "status": {"const": "compacted"},
            "summarised": INT,
            "first_sequence": INT,
            "last_sequence": INT,
            "summary_sequence": INT,
            "side_branch_sequence": INT,
            "tokens_before": INT,
            "tokens_after": INT,
        }
    ),
    "Dag": obj(
        {
            "trace_id": STR,
            "status": STR,
            "head_sequence": {"type": ["integer", "null"]},
            "focus_id": MAYBE_STR,
            "goals": {
                "type": "array",
                "items": obj(
                    {
                        "id": STR,
                        "description": STR,
                        "status": {"enum": ["pending", "in_progress", "done", "abandoned"]},
                        "messages": {"type": "array", "items": INT},
                        "sub_agents": {"type": "array", "items": STR},
                        "rewound": BOOL,
                        "greyed": BOOL,
                    }
                ),
            },
            "unplanned": {"type": "array", "items": INT},
            "messages": {
                "type": "array",
                "items": obj({"sequence": INT, "role": STR, "main": BOOL, "label": STR}),
            },
            "sub_agents": LIST,
            "branches": LIST,
        }
    ),
    "Summary": obj(
        {
            "trace_id": STR,
            "root_trace_id": STR,
            "parent_trace_id": MAYBE_STR,
            "mode": STR,
            "status": {"enum": ["queued", "running", "waiting", "completed", "failed", "stopped"]},
            "task": STR,
            "stats": OBJECT,
        }
    ),
    "TraceList": obj(
        {"traces": {"type": "array", "items": {"$ref": REF.format(model="Summary")}}},
        next=MAYBE_STR,
    ),
    "TraceDetail": obj(
        {"trace": OBJECT, "children": LIST, "collaborators": LIST, "models": OBJECT},
        budget={"type": ["object", "null"]},
    ),
    "Message": obj(
        {"sequence": INT, "role": {"enum": ["system", "user", "assistant", "tool"]}},
        parent_sequence={"type": ["integer", "null"]},
    ),
    "Messages": obj(
        {
            "mode": {"enum": ["all", "main_path"]},
            "messages": {"type": "array", "items": {"$ref": REF.format(model="Message")}},
            "head_sequence": {"type": ["integer", "null"]},
            "branches": LIST,
        }
    ),
}
