"""`TraceWrite` to the keys and arguments of `redis_scripts.APPLY`, and its reply back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleet import keys
from fleet.models import Event, Trace, now_ms
from fleet.store import STATS_FIELDS, with_sequence
from fleet.writes import (
    AddStats,
    Append,
    Emit,
    PutCollaborator,
    ReleaseLease,
    SetFields,
    TraceWrite,
    WriteOp,
    WriteResult,
)

FLOAT_STATS = frozenset({"cost_usd"})
# The required Trace fields, so that an update's fields validate without reading the trace.
_PLACEHOLDER: dict[str, Any] = {"trace_id": "_", "root_trace_id": "_", "task": ""}


def encode_fields(fields: Mapping[str, Any]) -> list[str]:
    """Validated trace fields as HSET items, each value as JSON (`updated_at_ms` added)."""
    values = {"updated_at_ms": now_ms(), **fields}
    patch = Trace.model_validate({**_PLACEHOLDER, **values}).model_dump(
        mode="json", include=set(values)
    )
    return [item for k, v in patch.items() for item in (k, json.dumps(v, ensure_ascii=False))]


def whole(name: str, delta: float) -> int:
    """A stats delta that must count whole units."""
    if isinstance(delta, int) or float(delta).is_integer():
        return int(delta)
    raise ValueError(f"stats field {name!r} counts whole units, got {delta!r}")


def stats_items(deltas: dict[str, float]) -> list[str]:
    """name, kind (`i` or `f`), delta triples for the scripts' stats loops."""
    items: list[str] = []
    for name, delta in deltas.items():
        if name not in STATS_FIELDS:
            raise ValueError(f"unknown stats field {name!r}")
        if name in FLOAT_STATS:
            items += [name, "f", repr(float(delta))]
        else:
            items += [name, "i", str(whole(name, delta))]
    return items


def _event(event: Event | None) -> str:
    return "" if event is None else event.model_dump_json()


def _append(op: Append) -> list[str]:
    message = op.message
    body = message.model_dump_json(exclude={"sequence", "parent_sequence"})
    head = tail = ""
    if op.event is not None:
        # The script writes the sequence where the placeholder -1 stood.
        text = with_sequence(op.event, -1).model_dump_json()
        head, found, tail = text.partition('"sequence":-1')
        assert found, "the event JSON lost its sequence placeholder"
        head += found[:-2]
    usage = [str(message.prompt_tokens), str(message.completion_tokens), repr(message.cost_usd)]
    iteration = "" if op.iteration is None else str(op.iteration)
    model = message.model or ""  # a model's message: its usage also counts fleet-wide
    return ["add", body, head, tail, iteration, json.dumps(now_ms()), *usage, model]


def _op(op: WriteOp, trace_id: str) -> list[Any]:
    match op:
        case Append():
            return _append(op)
        case SetFields(fields=fields, event=event):
            return ["set", encode_fields(fields), _event(event)]
        case AddStats(deltas=deltas):
            return ["stats", *stats_items(deltas)]
        case PutCollaborator(collaborator=entry, event=event):
            return ["collab", entry.trace_id, entry.model_dump_json(), _event(event)]
        case Emit(event=event):
            return ["emit", event.model_dump_json()]
        case ReleaseLease(owner=owner):
            return ["release", owner, trace_id]


def apply_call(write: TraceWrite) -> tuple[list[str], list[str | int]]:
    """The KEYS and ARGV of `APPLY` for this write."""
    trace_id = write.trace_id
    script_keys = [
        keys.trace(trace_id),
        keys.stats(trace_id),
        keys.messages(trace_id),
        keys.events(write.root_trace_id),
        keys.USAGE,
        keys.lease(trace_id),
        keys.RUNNING,
        keys.stop(trace_id),
    ]
    parents = [op.parent_trace_id for op in write.ops if isinstance(op, PutCollaborator)]
    if parents:
        script_keys += [keys.collaborators(parents[0]), keys.collaborator_order(parents[0])]
    ops = json.dumps([_op(op, trace_id) for op in write.ops], ensure_ascii=False)
    return script_keys, [keys.TRACE_TTL_S, keys.EVENTS_MAXLEN, ops]


def apply_result(write: TraceWrite, reply: Any) -> WriteResult | None:
    """The stored messages and the stop flag; None when the trace does not exist."""
    if reply is None:
        return None
    stored, stop = reply
    appended = [op.message for op in write.ops if isinstance(op, Append)]
    messages = [
        message.model_copy(update={"sequence": int(seq), "parent_sequence": json.loads(parent)})
        for message, (seq, parent) in zip(appended, stored, strict=True)
    ]
    return WriteResult(messages, bool(stop))


def pairs(flat: list[Any]) -> dict[str, str]:
    """A hash as a Lua script returns it (field, value, ...) as a dict."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))
