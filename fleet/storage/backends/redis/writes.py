"""What `RedisStore` sends to its scripts, and what it reads back, decoded.

A `TraceWrite` as the ARGV of `redis_scripts.APPLY`, new traces as `CREATE_TRACES`'
arguments; the trace hash (its messages included) and the event stream as models.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring
from typing import Any, cast

from pydantic import TypeAdapter

from fleet.errors import NewerRecord
from fleet.models import Event, Message, Trace, check_patch, now_ms
from fleet.runstate import RunPatch, RunState
from fleet.runstate import check_patch as check_run_patch
from fleet.storage import keys
from fleet.storage.compaction import PACKED_FIELD, unpacked
from fleet.storage.store import STATS_FIELDS
from fleet.storage.writes import (
    AddStats,
    Append,
    Emit,
    InboxSeen,
    PauseRead,
    PutCollaborator,
    ReleaseLease,
    SetFields,
    SetRun,
    TraceWrite,
    WriteExtension,
    WriteOp,
    WriteResult,
)

log = logging.getLogger(__name__)

FLOAT_STATS = frozenset({"cost_usd"})
STOP_FIELD = "stop"
"""The trace hash's field that is present ("1") while a stop is requested; not a Trace field."""
MESSAGE_FIELD = "m:"
"""The prefix of the trace hash's message fields: `m:{sequence}` -> Message JSON."""
UNCOUNTED_FIELD = "uncounted"
"""The trace hash's field of model usage not yet in `keys.USAGE`; not a Trace field."""
_NOT_TRACE_FIELDS = frozenset({STOP_FIELD, UNCOUNTED_FIELD, PACKED_FIELD})
RUN_FIELD = keys.RUN_FIELD
TRACE_FIELDS = tuple(name for name in Trace.model_fields if name != "run")
"""The trace hash's fields a Trace is read from (its messages are left where they are)."""
RUN_FIELDS = tuple(RUN_FIELD + name for name in RunState.model_fields)
"""The trace hash's run-state fields this release knows (`fleet.runstate`)."""
READ_FIELDS = (*TRACE_FIELDS, *RUN_FIELDS, PACKED_FIELD)
"""What a read of a trace (not its messages) asks the trace hash for (`decode_fields`)."""
# Each Trace field on its own (no field has constraints beyond its type): an update
# validates only the fields it writes, not a whole placeholder Trace with its defaults.
_FIELD_TYPES: dict[str, TypeAdapter[Any]] = {
    name: TypeAdapter(cast(Any, info.annotation)) for name, info in Trace.model_fields.items()
}
_FIELD_ORDER = {name: i for i, name in enumerate(Trace.model_fields)}
_encode_json = json.JSONEncoder(ensure_ascii=False).encode
_SCALARS: dict[type, Callable[[Any], str]] = {
    str: encode_basestring,  # what the encoder itself does with a str
    int: int.__repr__,  # and with an int (a bool is not one here: its type is bool)
    bool: lambda value: "true" if value else "false",
    type(None): lambda _: "null",
    dict: lambda value: _encode_json(value) if value else "{}",  # context, metadata: often {}
    list: lambda value: _encode_json(value) if value else "[]",
}


def _to_json(value: Any) -> str:
    """`json.dumps(value, ensure_ascii=False)`, the same text, without its per-call set-up.

    Most trace fields are strings, ids, counts and empty dicts or lists: those skip the
    encoder, which builds its C encoder anew for every value that is not a str (~1.4 us; a
    new trace has 28 fields).
    """
    scalar = _SCALARS.get(type(value))
    return scalar(value) if scalar is not None else _encode_json(value)


def encode_fields(fields: Mapping[str, Any]) -> list[str]:
    """Validated trace fields as HSET items, each value as JSON (`updated_at_ms` added)."""
    values = {"updated_at_ms": now_ms(), **fields}
    check_patch(values)  # a stranger, and `run`, refused with one line
    items: list[str] = []
    for name in sorted(values, key=_FIELD_ORDER.__getitem__):  # as Trace.model_dump orders them
        adapter = _FIELD_TYPES[name]
        value = adapter.dump_python(adapter.validate_python(values[name]), mode="json")
        items += [name, _to_json(value)]
    return items


def run_items(fields: RunPatch | dict[str, Any]) -> list[str]:
    """Validated run-state fields as HSET items of the trace hash: `r:{name}`, JSON value."""
    checked = check_run_patch(fields)
    return [item for k, v in checked.items() for item in (RUN_FIELD + k, _to_json(v))]


def created_run_items(run: RunState) -> list[str]:
    """A new trace's run state as HSET items: its version and every field not at its default."""
    fields = run.model_dump(mode="json", exclude_defaults=True)
    fields["schema_version"] = run.schema_version
    return [item for k, v in fields.items() for item in (RUN_FIELD + k, _to_json(v))]


def whole(name: str, delta: float) -> int:
    """A stats delta that must count whole units."""
    if isinstance(delta, int) or float(delta).is_integer():
        return int(delta)
    raise ValueError(f"stats field {name!r} counts whole units, got {delta!r}")


def stats_items(deltas: Mapping[str, float]) -> list[str]:
    """name, delta pairs for APPLY's `stats` op (checked: known fields, whole counts)."""
    items: list[str] = []
    for name, delta in deltas.items():
        if name not in STATS_FIELDS:
            raise ValueError(f"unknown stats field {name!r}")
        items += [name, repr(float(delta)) if name in FLOAT_STATS else str(whole(name, delta))]
    return items


def _event(event: Event | None) -> str:
    return "" if event is None else event.model_dump_json()


def _append(op: Append) -> list[str]:
    message = op.message
    body = message.model_dump_json(exclude={"sequence", "parent_sequence"})
    head = tail = ""
    if op.event is not None:
        # The script writes the sequence first in the event's data (ids and kinds have no
        # quotes or braces, so the first `"data":{` is the data's).
        text = op.event.model_dump_json()
        head, found, tail = text.partition('"data":{')
        assert found, "an event without its data"
        head += found + '"sequence":'
        tail = ("," if op.event.data else "") + tail
    usage = [str(message.prompt_tokens), str(message.completion_tokens), repr(message.cost_usd)]
    cached = [str(message.cached_tokens), str(message.cache_write_tokens)]
    iteration = "" if op.iteration is None else str(op.iteration)
    model = message.model or ""  # a model's message: its usage also counts fleet-wide
    return ["add", "11", body, head, tail, iteration, str(now_ms()), *usage, model, *cached]


def _op(op: WriteOp, write: TraceWrite, fenced_by: str | None, extension_at: int) -> list[str]:
    match op:
        case Append():
            return _append(op)
        case SetFields(fields=fields, event=event):
            items = encode_fields(fields)
            return ["set", str(len(items) + 1), _event(event), *items]
        case SetRun(fields=fields):
            items = run_items(fields)
            return ["set", str(len(items) + 1), "", *items]
        case AddStats(deltas=deltas):
            items = stats_items(deltas)
            return ["stats", str(len(items)), *items]
        case PutCollaborator(parent_trace_id=parent, collaborator=entry, event=event):
            own = "1" if parent == write.trace_id else ""
            return ["collab", "4", entry.trace_id, entry.model_dump_json(), _event(event), own]
        case Emit(event=event):
            return ["emit", "1", event.model_dump_json()]
        case ReleaseLease(owner=owner):
            return ["release", "3", owner, write.trace_id, "1" if owner == fenced_by else ""]
        case WriteExtension():  # its keys are in KEYS from `extension_at` on
            args = op.args()
            return ["ext", str(len(args) + 2), str(extension_at), str(len(op.keys)), *args]


THAWED_ARG = 7
"""The index in `apply_call`'s ARGV of the flag of a write retried after a thaw."""


def apply_call(
    write: TraceWrite, fenced_by: str | None = None, *, split: bool = False
) -> tuple[list[str], list[str]]:
    """The KEYS and ARGV of `APPLY` for this write.

    `fenced_by`: the owner a fenced store checks the lease of in the same script, whose
    release needs no second check. `split` (a cluster): no key outside the trace's slot
    (the usage hash and the running index are stand-ins, the pauses are read apart).
    """
    trace_id = write.trace_id
    trace_key = keys.trace(trace_id)
    script_keys = [
        trace_key,
        keys.events(write.root_trace_id),
        trace_key if split else keys.USAGE,
        keys.lease(trace_id),
        trace_key if split else keys.RUNNING,
    ]
    parents = [op.parent_trace_id for op in write.ops if isinstance(op, PutCollaborator)]
    if parents:
        script_keys += [keys.collaborators(parents[0]), keys.collaborator_order(parents[0])]
    extension_at = len(script_keys) + 1
    for op in write.ops:
        if isinstance(op, WriteExtension):  # one per write (`TraceWrite.extend`)
            script_keys += op.keys
    if write.inbox:  # the tree's: in the trace's slot
        script_keys.append(keys.inbox(trace_id))
    pauses = [] if split else write.pauses
    script_keys += pauses
    root = "1" if trace_id == write.root_trace_id else ""
    args = [str(keys.TRACE_TTL_S), str(keys.EVENTS_MAXLEN), root, str(len(pauses))]
    args += ["1" if split else "", "1" if write.inbox else "", "1" if write.unless_stopped else ""]
    args.append("")  # THAWED_ARG: '1' once the trace was thawed for this write
    for op in write.ops:
        args += _op(op, write, fenced_by, extension_at)
    return script_keys, args


def apply_result(write: TraceWrite, reply: Any) -> WriteResult | None:
    """The stored messages, the stop flag and the pauses read; None when there is no trace."""
    if reply is None:
        return None
    stored, stop, ttls, extended = reply[:4]
    for op in write.ops:
        if isinstance(op, WriteExtension):
            op.applied, op.reply = True, extended
    appended = [op.message for op in write.ops if isinstance(op, Append)]
    messages = [_numbered(m, n) for m, n in zip(appended, stored, strict=True)]
    pauses = PauseRead.of(write.pauses, ttls) if write.pauses and ttls else None
    return WriteResult(messages, bool(stop), pauses, inbox_seen(reply[6] if write.inbox else None))


def inbox_seen(newest: Any) -> InboxSeen | None:
    """The inbox's newest entry id as a script read it ('' for none; None: not read)."""
    if newest is None:
        return None
    return InboxSeen(str(newest) or None)


def _numbered(message: Message, stored: list[Any]) -> Message:
    """The message with the sequence and parent the script gave it (a copy if they differ)."""
    sequence, parent = int(stored[0]), json.loads(stored[1])
    if (message.sequence, message.parent_sequence) == (sequence, parent):
        return message  # numbered by its writer as the store numbered it
    return message.model_copy(update={"sequence": sequence, "parent_sequence": parent})


def extension_of(write: TraceWrite) -> str | None:
    """The name of the write's extension, if it has one (its `APPLY` includes that one)."""
    return next((op.name for op in write.ops if isinstance(op, WriteExtension)), None)


def create_call(
    traces: Sequence[Trace], outbox: tuple[str, int] | None = None
) -> tuple[list[str], list[str]]:
    """The KEYS and ARGV of `CREATE_TRACES`; with `outbox` (entry, due ms), it is put too."""
    script_keys, args = [keys.TRACES], [str(keys.TRACE_TTL_S), "1"]
    for trace in traces:
        fields = encode(trace.model_dump(mode="json", exclude={"run"}))
        fields += created_run_items(trace.run)
        parent = trace.parent_trace_id
        script_keys += [keys.trace(trace.trace_id), keys.children(parent or trace.trace_id)]
        args += [trace.trace_id, str(trace.created_at_ms), "1" if parent else "", str(len(fields))]
        args += fields
    if outbox is not None:
        script_keys.append(keys.OUTBOX)
        args += [outbox[0], str(outbox[1])]
    return script_keys, args


def stored_message(message: Message, reply: Any) -> Message | None:
    """The message as a numbering script stored it (`[sequence, parent JSON]`); None: no trace."""
    if reply is None:
        return None
    sequence, parent = reply
    return message.model_copy(
        update={"sequence": int(sequence), "parent_sequence": json.loads(parent)}
    )


def encode(fields: Mapping[str, Any]) -> list[str]:
    """Field/value items for HSET, each value as JSON."""
    return [item for k, v in fields.items() for item in (k, _to_json(v))]


def pairs(flat: list[Any]) -> dict[str, str]:
    """A hash as a Lua script returns it (field, value, ...) as a dict."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))


def decode_messages(data: Mapping[str, str]) -> list[Message]:
    """The messages in a trace hash, by sequence."""
    found = {
        int(k[len(MESSAGE_FIELD) :]): v for k, v in data.items() if k.startswith(MESSAGE_FIELD)
    }
    return [Message.model_validate_json(found[s]) for s in sorted(found)]


def decode_trace(data: Mapping[str, str]) -> Trace | None:
    """The trace hash as a Trace (stats included); None for an empty (missing) hash."""
    if not data:
        return None
    # The values are JSON texts already: one JSON object of them, parsed by pydantic at once.
    # The run state's fields, `r:{name}`, are the object of its `run` (one a newer release
    # added is ignored there, one an older trace lacks takes its default).
    text = ",".join(
        f'"{name}":{value}'
        for name, value in data.items()
        if name not in _NOT_TRACE_FIELDS and not name.startswith((MESSAGE_FIELD, RUN_FIELD))
    )
    run = ",".join(
        f"{json.dumps(name[len(RUN_FIELD) :])}:{value}"
        for name, value in data.items()
        if name.startswith(RUN_FIELD)
    )
    return Trace.model_validate_json("{" + text + (',"run":{' if text else '"run":{') + run + "}}")


def decode_fields(
    values: Sequence[str | None],
    unpack: Callable[[dict[str, str]], dict[str, str]] = unpacked,
) -> Trace | None:
    """A Trace from an HMGET of TRACE_FIELDS, RUN_FIELDS and the packed field; None: no hash.

    `unpack` spreads a packed hash (`fleet.storage.compaction`), with the tree dictionaries.
    """
    data = {k: v for k, v in zip(READ_FIELDS, values, strict=True) if v is not None}
    return decode_trace(unpack(data) if PACKED_FIELD in data else data)


def stream_entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """The entries of the one stream an XREAD read; RESP2 and RESP3 shape the reply apart."""
    if not reply:
        return []
    if isinstance(reply, dict):
        (entries,) = reply.values()
        return list(entries[0]) if entries and isinstance(entries[0], list) else list(entries)
    return list(reply[0][1])


def readable_events(entries: list[tuple[str, dict[str, str]]]) -> list[tuple[str, Event]]:
    """The stream's events this release reads.

    One a newer release wrote in a form this one does not read (a new kind, a newer
    `schema_version`) is left out with one log line, so a follower of the tree goes on.
    """
    events: list[tuple[str, Event]] = []
    for entry_id, fields in entries:
        try:
            events.append((str(entry_id), Event.model_validate_json(fields["e"])))
        except (ValueError, NewerRecord) as exc:
            log.warning("event %s left out: %s", entry_id, str(exc).splitlines()[0])
    return events
