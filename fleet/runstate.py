"""The fleet's own state of one run: every key the fleet reads or writes about a trace.

`Trace.metadata` belongs to the caller alone (a submission, a batch line, an API call fill
it; the fleet never reads it). What the fleet itself keeps about a run — its retries and
fallbacks, what it waits on, the call a person approved, how it was created — is a
`RunState`, the trace's `run`. No submission sets any of it: a root's run state is built
from the typed options of its `TaskSpec` (`fleet.conversation.roots.create_root`), a
child's by its spawner.

Stored field by field: each field is a field of its own of the trace hash,
`r:{name}` (`fleet.storage.keys.trace`), written by HSET of that field only
(`TraceWrite.update_run`, `TraceStore.update_run`), in the same atomic step as the write it
belongs to and behind the same lease fence. Two writers of different fields never undo each
other (no read-modify-write of a whole dict), and compaction, archives and the cluster's
hash tag carry it with the trace.

Readers are tolerant: a field this release does not know is ignored, a field it knows but
an older record lacks takes its default (`schema_version` says which release wrote it).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

RUN_SCHEMA_VERSION = 1
"""The `RunState.schema_version` this release writes."""

BatchCallState = Literal["parked", "answered", "live", "cancelled", "consumed"]
"""Where a trace's call parked on a provider batch is (`fleet.batchapi.route`)."""


class _Part(BaseModel):
    """A part of the run state: tolerant of fields a newer release added."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class BatchWait(_Part):
    """The trace's model call on a provider batch, until the resumed run consumed its answer."""

    custom_id: str | None = None
    state: BatchCallState = "parked"


class Fallback(_Part):
    """One move of a trace to its model's fallback alias (`fleet.llm.fallback`)."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, validate_by_name=True, serialize_by_alias=True
    )

    from_model: str = Field(alias="from")
    """The model that failed (`from` in JSON)."""
    to: str
    error: str = ""


class ContextNote(_Part):
    """The last fitting of the trace's conversation into its model's window (`loop.fit`)."""

    compactions: int = 0
    elided: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    window: int = 0


class FanOutPlan(_Part):
    """A fan-out root's tasks, explored without a model deciding (`conversation.fanout`)."""

    tasks: list[str]
    preset: str = "explore"


REMOTE_ENTRY_PREFIX = "agent://"
"""A remote task's id, as a collaborator entry and `continue_from` name it: `agent://NAME/ID`."""

RemoteCallState = Literal["new", "sent", "input", "ended"]
"""new: nothing sent yet; sent: the task works (a poller watches it); input: it asked for
input (a person answers, `fleet reply`); ended: the call's `result` holds its end."""


class RemoteCall(_Part):
    """Where a remote child's A2A task is (`fleet.remote`): the child's `run.remote_call`."""

    agent: str
    """The `remote_agents` name the call goes to."""
    state: RemoteCallState = "new"
    task_id: str | None = None
    context_id: str | None = None
    """The remote conversation: a later message (`continue_from`) goes to it."""
    sent_sequence: int = 0
    """The child's last message that went to the remote task."""
    tasks: tuple[str, ...] = ()
    """Earlier tasks of this child's remote conversation (each `continue_from` makes one)."""
    deadline_ms: int | None = None
    """When the remote task is cancelled and the child fails (timeout_s or the tree's wall_s)."""
    seen: str = ""
    """The last status text seen (a poll that sees it again adds no event)."""
    errors: int = 0
    """Polls in a row that could not reach the agent."""
    streams: bool | None = None
    """The agent's card says it streams: the watcher follows the task over SSE (None: not
    read yet; False: polled with GetTask)."""
    ok: bool = False
    result: str = ""
    """The artifact's text (ok) or a one-line error."""

    def remote_id(self) -> str | None:
        """`agent://NAME/<task id>`, once the agent gave a task id."""
        return f"{REMOTE_ENTRY_PREFIX}{self.agent}/{self.task_id}" if self.task_id else None


class RunState(_Part):
    """The fleet's own state of one trace, apart from the caller's `metadata`."""

    schema_version: int = RUN_SCHEMA_VERSION
    """The release's run-state version that created the trace."""
    # -- how the trace was created (its spawner or create_root, never a submission's text)
    fan_out: FanOutPlan | None = None
    """A fan-out root's plan."""
    batch_api: bool = False
    """The tree's model calls go through the providers' Batch APIs."""
    budgeted: bool | None = None
    """A root's: whether its tree has a budget (written before the root, for the tree's
    life), so `begin_run` need not look for one; None: not said (a child, an older root)."""
    batch: str | None = None
    """The batch file run this root belongs to (`fleet.batch`: the journal finds orphans)."""
    batch_entry: str | None = None
    """The id of this root's entry in that batch file."""
    human_timeout_s: int | None = None
    """This run's own wait on a person (`fleet run --human-timeout-s`); else the fleet's."""
    warm_after_first: bool = False
    """An explore branch (not the first) whose first call waits for the first branch's."""
    cache_key: str | None = None
    """The result-cache key a child's answer is stored under once it completes."""
    cache_ttl_s: int | None = None
    """How long that answer is kept."""
    otel: dict[str, str] | None = None
    """The tracing context the trace's runs continue (`fleet.observe.otel_spans`)."""
    turn: int = 0
    """How many times the root was continued (0 for its first run); a child: its root's."""
    scheduled: bool | None = None
    """A root: whether its tree was given a schedule of its own at submit (`max_concurrent`,
    `batch` priority: `fleet.limits.trees`), so a spawn reads it only then. None: not
    known (a child, a root of an earlier release): the schedule is read."""
    # -- what its runs wrote
    transient_retries: int = 0
    """Provider errors that handed the run back to be run later (`loop.turns`)."""
    overloads: int = 0
    """Provider 429/503/529 pauses that handed the run back (`loop.turns`)."""
    model_fallbacks: list[Fallback] = Field(default_factory=list)
    """Every move to a fallback model, in order."""
    context: ContextNote | None = None
    """The last fitting of the conversation (`loop.fit`)."""
    waiting_on: dict[str, Any] | None = None
    """While a person is asked (`ask_human`, an approval): kind, tool_call_id, question,
    asked_at_ms, deadline_ms, timeout_s, ends, and for an approval tool and arguments."""
    approved_call: str | None = None
    """The tool_call_id a person approved, run by the next run, then cleared."""
    waiting_on_batch: BatchWait | None = None
    """The model call parked on a provider batch."""
    remote_call: RemoteCall | None = None
    """A remote child's A2A call (mode `remote`): set by its spawner, written by its runs
    and the pollers of the watch list (`fleet.remote`)."""
    owner_heals: int = 0
    """How many remedies the owner check applied to the trace (`fleet.owners`)."""
    stop_reason: str | None = None
    """Why the trace ended (`lifecycle.finish`); cleared when a root is continued."""


class RunPatch(TypedDict, total=False):
    """The run-state fields one write sets, each on its own (`TraceStore.update_run`).

    `schema_version` is written with the trace, never patched.
    """

    fan_out: FanOutPlan | None
    batch_api: bool
    budgeted: bool | None
    batch: str | None
    batch_entry: str | None
    human_timeout_s: int | None
    warm_after_first: bool
    cache_key: str | None
    cache_ttl_s: int | None
    otel: dict[str, str] | None
    turn: int
    scheduled: bool | None
    transient_retries: int
    overloads: int
    model_fallbacks: list[Fallback]
    context: ContextNote | None
    waiting_on: dict[str, Any] | None
    approved_call: str | None
    waiting_on_batch: BatchWait | None
    remote_call: RemoteCall | None
    owner_heals: int
    stop_reason: str | None


def check_patch(fields: RunPatch | dict[str, Any]) -> dict[str, Any]:
    """The patch's fields validated one by one, as JSON values; `ValueError` names a stranger."""
    unknown = set(fields) - RunPatch.__optional_keys__
    if unknown:
        raise ValueError(f"not a run-state field: {sorted(unknown)[0]!r}")
    checked = RunState.model_validate(fields)
    return checked.model_dump(mode="json", include=set(fields))
