"""The persisted data: traces, messages, collaborators.

These are pydantic models because they cross the edge into Redis and task messages;
`model_dump_json` / `model_validate_json` round-trip them exactly, fields a newer release
added included (`Record`: the schema version and the rules between releases).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypedDict, Unpack

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    model_serializer,
)

from fleet.errors import NewerRecord
from fleet.goals import GoalTree
from fleet.runstate import RunPatch, RunState
from fleet.runstate import check_patch as check_run_patch  # the trace's own: check_patch

Mode = Literal["main", "delegate", "explore", "evaluate", "remote"]
Status = Literal["queued", "running", "waiting", "completed", "failed", "stopped"]
CollaboratorStatus = Literal["running", "waiting", "completed", "failed", "stopped"]
CollaboratorType = Literal["agent", "human", "approval", "batch", "remote"]
Role = Literal["system", "user", "assistant", "tool"]
Content = str | list[dict[str, Any]] | None
"""A message's content: text, or a list of OpenAI-format parts (`text`, and `image_ref`:
an image stored once per tree by the store, never its bytes; see `fleet.storage.images`)."""

TERMINAL: frozenset[str] = frozenset({"completed", "failed", "stopped"})


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return int(time.time() * 1000)


# -- records across releases: the schema version and the tolerant reader ---------------
# Everything the fleet keeps in Redis or sends in a task message is read, during a rolling
# upgrade, by the release before this one and the release after it (docs/operations.md,
# "Upgrading"). A `Record` follows three rules:
#
# - **Unknown fields are kept.** A field a newer release added is read into the model's
#   extras and written back with it when the record is rewritten whole (a collaborator
#   entry, a memory entry); records updated field by field (the trace hash) never touch it.
# - **Missing fields take their defaults**, so a record an older release wrote reads here.
# - **A field added since the previous release is written only when it says something** (not
#   at its default), and the record then carries `schema_version`: the oldest schema that
#   reads it right. A record without one is schema 1 (release 0.1.0, which refuses any field
#   it does not know: so what this release writes by default must carry no field 0.1.0 lacks).
#   A reader older than a record's `schema_version` refuses that record, one line
#   (`NewerRecord`), and nothing else.
SCHEMA_VERSION = 2
"""The record schema this release writes and reads: 1 was release 0.1.0's (no version on any
record), 2 adds `schema_version` where a record needs it, the trace's memory namespaces and
unknown fields kept."""

UNVERSIONED = 1
"""The schema of a record that carries no `schema_version`."""

TASK_SCHEMA = 1
"""The oldest schema that runs this release's task messages right (their `fleet_schema`
header): their arguments have not changed since release 0.1.0. A task argument added later
must be one an older worker may ignore (the tasks take `**newer`), or raise this."""


def newer_than_this(schema: object) -> bool:
    """Whether a record's or a message's schema is above the one this release reads."""
    return isinstance(schema, int) and schema > SCHEMA_VERSION


class Kept(BaseModel):
    """A value inside a stored record: the fields this release does not know are kept."""

    model_config = ConfigDict(extra="allow")


def _readable(version: int, info: ValidationInfo) -> int:
    """A record's `schema_version`, or `NewerRecord` when it is above this release's."""
    if version > SCHEMA_VERSION:
        kind = (info.config or {}).get("title", "record")
        raise NewerRecord(
            f"a {kind} written by a newer release (schema {version};"
            f" this one reads up to {SCHEMA_VERSION}): upgrade it"
        )
    return version


def _unversioned(version: int) -> bool:
    return version == UNVERSIONED


class Record(Kept):
    """A stored record: unknown fields kept, `schema_version` written only when above 1."""

    schema_version: Annotated[int, AfterValidator(_readable)] = Field(
        default=UNVERSIONED, exclude_if=_unversioned
    )
    """The oldest schema that reads this record right (checked only when present)."""


class Evolving(Record):
    """A record with fields added since schema 1: `SINCE` names each and its schema.

    Such a field is written only when it is not at its default, and then raises the
    written `schema_version` to the schema that added it.
    """

    SINCE: ClassVar[dict[str, int]] = {}

    @model_serializer(mode="wrap")
    def _written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        floor = data.pop("schema_version", UNVERSIONED)  # written last, whatever its source
        for name, since in self.SINCE.items():
            if name in data and getattr(self, name) != _default(type(self), name):
                floor = max(floor, since)
            else:
                data.pop(name, None)  # at its default: an older reader lacks nothing
        if floor > UNVERSIONED:
            data["schema_version"] = floor
        return data


@functools.cache
def _default(model: type[BaseModel], name: str) -> Any:
    """A field's default, made once (compared with, never handed out)."""
    return model.model_fields[name].get_default(call_default_factory=True)


def unknown_fields(record: BaseModel) -> list[str]:
    """The fields of `record` and its nested records that this release does not know."""
    found = [f"{name!r}" for name in record.model_extra or {}]
    for name in type(record).model_fields:
        value = getattr(record, name)
        nested = value if isinstance(value, list) else [value]
        found += [
            f"{name}.{inner}"
            for v in nested
            if isinstance(v, BaseModel)
            for inner in unknown_fields(v)
        ]
    return found


class TraceStats(Kept):
    """Running totals of a trace."""

    messages: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    duration_ms: int = 0
    cached_tokens: int = 0
    """Prompt tokens the provider's prompt cache served (part of `prompt_tokens`)."""
    cache_write_tokens: int = 0
    """Prompt tokens written to the provider's prompt cache (part of `prompt_tokens`)."""


class Collaborator(Evolving):
    """One child (or human) working for a parent trace.

    An entry is rewritten whole at every status change: a field added to it goes in `SINCE`,
    or the previous release refuses every entry of every parent its workers settle.
    """

    SINCE: ClassVar[dict[str, int]] = {"remote_id": 2}

    name: str
    type: CollaboratorType = "agent"
    trace_id: str
    status: CollaboratorStatus = "running"
    summary: str = ""
    mode: Mode = "delegate"
    tool_call_id: str | None = None
    stats: TraceStats = Field(default_factory=TraceStats)
    output: dict[str, Any] | None = None
    """The child's validated structured answer (evaluate verdict, `output_schema`)."""
    batch_id: str | None = None
    """For `type: batch`: the provider batch holding the call (None while queued)."""
    remote_id: str | None = None
    """For a `remote` child: its A2A task, `agent://NAME/<task id>` (None until sent)."""
    updated_at_ms: int = Field(default_factory=now_ms)


class Message(Record):
    """An OpenAI-format message plus its place in the trace's message tree."""

    trace_id: str
    sequence: int = 0
    """Assigned by the store on append; unique and increasing within a trace."""
    parent_sequence: int | None = None
    """The message before this one on its branch; None for the first message."""
    role: Role
    content: Content = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    long_term_memory: str | None = None
    """Short form that replaces a large tool output once the model has seen it."""
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cached_tokens: int = 0
    """Of `prompt_tokens`, read from the provider's prompt cache."""
    cache_write_tokens: int = 0
    """Of `prompt_tokens`, written to the provider's prompt cache."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at_ms: int = Field(default_factory=now_ms)

    def to_openai(self, *, compact: bool = False) -> dict[str, Any]:
        """The wire form for a model; `compact` swaps in `long_term_memory` if present."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if compact and self.long_term_memory:
            out["content"] = self.long_term_memory
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name and self.role == "tool":
            out["name"] = self.name
        return out


def text_of(content: Content) -> str:
    """The text of a message's content; each image part is shown as a placeholder."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(
        str(part.get("text", "")) if part.get("type") == "text" else image_placeholder(part)
        for part in content
    )


def image_placeholder(part: dict[str, Any]) -> str:
    """`[image PNG 800x600, 12.3 KB]` for an `image_ref` part (what people are shown)."""
    ref = part.get("image_ref") or {}
    kind = str(ref.get("media_type", "image/?")).removeprefix("image/").upper()
    size_kb = int(ref.get("bytes", 0)) / 1000
    return f"[image {kind} {ref.get('width', '?')}x{ref.get('height', '?')}, {size_kb:.1f} KB]"


class DomainLayer(Kept):
    """One layer of a parent's web domain filter (`fleet.config.webfilter.DomainRules`)."""

    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)


class ToolCeiling(Kept):
    """The most a trace may do, whatever its preset says: what its parent could do.

    Set when a child is created and enforced where tools run, so no child ever holds a
    tool its parent lacks and a read-only parent's children are read-only too.
    """

    allowed: list[str] | None = None
    """Tools the parent could call; None: no limit beyond `denied`."""
    denied: list[str] = Field(default_factory=list)
    read_only: bool = False
    mcp: list[str] | None = None
    """MCP servers the parent could use; None: no limit."""
    web: list[DomainLayer] = Field(default_factory=list)
    """The parent's web domain filter beyond fleet.yaml's: the child's own preset's filter
    is narrowed by every layer (never widened)."""


class Trace(Evolving):
    """A main agent, a sub-agent or an evaluator: everything is a trace."""

    SINCE: ClassVar[dict[str, int]] = {"memory": 2}

    trace_id: str
    root_trace_id: str
    parent_trace_id: str | None = None
    mode: Mode = "main"
    status: Status = "queued"
    task: str
    name: str = ""
    """The collaborator name the parent knows this trace by."""
    preset: str = "default"
    model: str | None = None
    workspace: str | None = None
    parent_tool_call_id: str | None = None
    """The parent's `agent`/`evaluate` call that spawned this trace."""
    context: dict[str, Any] = Field(default_factory=dict)
    skills: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    """The caller's own data (a submission's, a batch line's): the fleet never reads it."""
    run: RunState = Field(default_factory=RunState)
    """The fleet's own state of this trace (`fleet.runstate`): stored field by field, written
    only through `update_run`/`TraceWrite.update_run`, never by an update of the trace."""
    ceiling: ToolCeiling = Field(default_factory=ToolCeiling)
    """Inherited from the parent: this trace's tools are its preset's within this."""
    memory: list[str] = Field(default_factory=list)
    """Long-term memory namespaces the submitter bound to the tree (`fleet.memory`),
    inherited by every child; the memory tools reach these and no other. Set when the
    trace is created, never from model text nor `metadata`."""
    answer: str | None = None
    output: dict[str, Any] | None = None
    """The final answer as a validated object, for presets with an output schema."""
    error: str | None = None
    iteration: int = 0
    head_sequence: int | None = None
    last_sequence: int = 0
    stats: TraceStats = Field(default_factory=TraceStats)
    goals: GoalTree = Field(default_factory=GoalTree)
    created_at_ms: int = Field(default_factory=now_ms)
    updated_at_ms: int = Field(default_factory=now_ms)
    finished_at_ms: int | None = None

    @property
    def is_terminal(self) -> bool:
        """True once the trace completed, failed or was stopped."""
        return self.status in TERMINAL

    def with_run(self, **fields: Unpack[RunPatch]) -> Trace:
        """A copy with these run-state fields set (as `update_run` writes them)."""
        run = RunState.model_validate({**self.run.model_dump(), **check_run_patch(fields)})
        return self.model_copy(update={"run": run})


def task_images(trace: Trace) -> str:
    """`2 image(s): [image PNG 800x600, 12.3 KB], ...` for a task given images; else ""."""
    refs = [p for p in trace.context.get("images") or [] if isinstance(p, dict)]
    if not refs:
        return ""
    return f"{len(refs)} image(s): " + ", ".join(image_placeholder(p) for p in refs[:5])


class TracePatch(TypedDict, total=False):
    """The fields of a `Trace` an update may write (the store's `update_trace`).

    Identity (`trace_id`, `root_trace_id`, `parent_trace_id`, `mode`, `task`, `created_at_ms`)
    and `stats` (added to with `add_stats`) are never overwritten; `run` is written field by
    field (`update_run`), never as a whole.
    """

    status: Status
    name: str
    preset: str
    model: str | None
    workspace: str | None
    parent_tool_call_id: str | None
    context: dict[str, Any]
    skills: list[str]
    metadata: dict[str, Any]
    ceiling: ToolCeiling
    answer: str | None
    output: dict[str, Any] | None
    error: str | None
    iteration: int
    head_sequence: int | None
    last_sequence: int
    goals: GoalTree
    updated_at_ms: int
    finished_at_ms: int | None


def check_patch(fields: Mapping[str, object]) -> None:
    """`ValueError` naming `run` or a stranger (kept when read, `Record`, never invented)."""
    if "run" in fields:
        raise ValueError("the run state is written field by field (update_run), not as a whole")
    strangers = sorted(set(fields) - Trace.model_fields.keys())
    if strangers:
        raise ValueError(f"{strangers[0]!r} is not a field of a trace this release writes")


class Event(Record):
    """One entry of a trace tree's event stream."""

    kind: Literal["trace", "message", "collaborator", "finish", "stop", "context"]
    trace_id: str
    status: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    at_ms: int = Field(default_factory=now_ms)


class WorkerPresence(Record):
    """A live worker as its heartbeat announces it (`fleet:worker:{node}`)."""

    node: str
    """The Celery node name (`name@host`)."""
    queues: list[str]
    host: str = ""
    pid: int = 0
    roots: list[str] = Field(default_factory=list)
    """The worker's workspace roots (`FLEET_WORKSPACE_ROOTS`): a client refuses a workspace
    that no live worker of its queue would accept. Empty from a worker that predates it."""
    started_at_ms: int = Field(default_factory=now_ms)
