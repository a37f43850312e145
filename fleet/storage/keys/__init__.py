"""Every Redis key agent-fleet uses, with its TTL and what it holds.

One screen tells the whole storage schema. All keys share `PREFIX`; ids are trace ids,
checked by `ids.check_trace_id`: `ROOT:messages` is not a trace id, so no caller can make
a trace key name another one.

Two layouts: the plain one (a single Redis), and the cluster one (`use_cluster_layout`,
FLEET_REDIS_CLUSTER=1), where a tree's keys carry its root as the hash tag
(`fleet:trace:{ROOT}@explore-001-...`), the limiter's `{limits}` and the provider batches'
`{batch}` (`fleet.storage.keys.layout`). The limiter's and the batches' keys are in
`keys/limits.py` and `keys/batch.py`, and importable from here as all the others.
"""

from __future__ import annotations

import re
from typing import Literal

from fleet.ids import check_trace_id
from fleet.storage.keys.a2a import A2A_RECENT_MAX as A2A_RECENT_MAX
from fleet.storage.keys.a2a import a2a_link as a2a_link
from fleet.storage.keys.a2a import a2a_recent as a2a_recent
from fleet.storage.keys.a2a import a2a_task as a2a_task
from fleet.storage.keys.batch import BATCH_TAG as BATCH_TAG
from fleet.storage.keys.batch import batch_answer as batch_answer
from fleet.storage.keys.batch import batch_calls as batch_calls
from fleet.storage.keys.batch import batch_deadlines as batch_deadlines
from fleet.storage.keys.batch import batch_in_flight as batch_in_flight
from fleet.storage.keys.batch import batch_poll as batch_poll
from fleet.storage.keys.batch import batch_polling as batch_polling
from fleet.storage.keys.batch import batch_queued as batch_queued
from fleet.storage.keys.batch import batch_state as batch_state
from fleet.storage.keys.batch import batch_submitting as batch_submitting
from fleet.storage.keys.layout import PREFIX as PREFIX
from fleet.storage.keys.layout import cluster_layout as cluster_layout
from fleet.storage.keys.layout import tree_id as _tree_id
from fleet.storage.keys.layout import use_cluster_layout as use_cluster_layout
from fleet.storage.keys.limits import LIMIT_LINE_STALE_MS as LIMIT_LINE_STALE_MS
from fleet.storage.keys.limits import LIMIT_STATE_TTL_S as LIMIT_STATE_TTL_S
from fleet.storage.keys.limits import LIMIT_TICKET_GRACE_MS as LIMIT_TICKET_GRACE_MS
from fleet.storage.keys.limits import LIMITS_TAG as LIMITS_TAG
from fleet.storage.keys.limits import budget as budget
from fleet.storage.keys.limits import budget_held as budget_held
from fleet.storage.keys.limits import limit_line as limit_line
from fleet.storage.keys.limits import limit_pause as limit_pause
from fleet.storage.keys.limits import limit_seen as limit_seen
from fleet.storage.keys.limits import limit_sends as limit_sends
from fleet.storage.keys.limits import limit_slots as limit_slots
from fleet.storage.keys.limits import limit_state as limit_state
from fleet.storage.keys.limits import limit_stats as limit_stats
from fleet.storage.keys.limits import limit_ticket as limit_ticket
from fleet.storage.keys.limits import searches as searches
from fleet.storage.keys.limits import tree as tree
from fleet.storage.keys.limits import window_pending as window_pending
from fleet.storage.keys.limits import window_running as window_running
from fleet.storage.keys.memory import MEMORY_NAMESPACES as MEMORY_NAMESPACES
from fleet.storage.keys.memory import memory_entries as memory_entries
from fleet.storage.keys.memory import memory_history as memory_history
from fleet.storage.keys.memory import memory_index as memory_index
from fleet.storage.keys.memory import memory_proposals as memory_proposals
from fleet.storage.keys.memory import memory_recent as memory_recent
from fleet.storage.keys.memory import memory_terms as memory_terms
from fleet.storage.keys.remote import remote_watch as remote_watch

TRACE_TTL_S = 7 * 24 * 3600
"""How long a trace and everything under it stays readable after its last change; once its
tree ended and was compacted, the retention (`Settings.retention_s`, this by default)."""

LEASE_TTL_MS = 5_000
"""A runner's lease (default of `Settings.lease_ttl_ms`); the worker's one heartbeat thread
(`fleet.storage.leases.LeaseKeeper`) renews every lease it holds every LEASE_TTL_MS / 5."""

EVENTS_MAXLEN = 10_000
"""Approximate cap of one trace tree's event stream."""


def trace(trace_id: str) -> str:
    """Hash: one field per top-level Trace attribute, each a JSON value, and its messages.

    `stats` (TraceStats) is added to inside the write scripts; `m:{sequence}` holds each
    message (Message JSON); `stop` ("1") is present while a stop is requested (runners check
    it between turns); `uncounted` (`{model: [prompt, completion, cost, cached]}`) holds
    the usage of model turns not yet added to USAGE, while a run has some; `r:{name}` holds
    one field of the trace's run state (`fleet.runstate.RunState`, JSON; see `RUN_FIELD`).
    Messages, the stop flag and `uncounted` are not Trace attributes.
    """
    return f"{PREFIX}:trace:{_tree_id(trace_id)}"


RUN_FIELD = "r:"
"""The prefix of the trace hash's run-state fields: `r:{name}` -> that `RunState` field's JSON.

The fleet's own state of a run, apart from the caller's `metadata` field; each one written by
HSET of that field alone (so two writers of different fields never undo each other), with the
trace hash's TTL, slot, compaction and archive. A field a reader does not know is ignored.
"""


# Layout 1 (up to wave 2) kept these three apart from the trace hash; layout 2 folded them in
# (`m:{sequence}`, `stats`, `stop`). Only `fleet migrate` (fleetops/migrate.py) reads them.


def legacy_messages(trace_id: str) -> str:
    """Layout 1: hash sequence -> Message JSON."""
    return f"{PREFIX}:trace:{check_trace_id(trace_id)}:messages"


def legacy_stats(trace_id: str) -> str:
    """Layout 1: hash of TraceStats counters (HINCRBY / HINCRBYFLOAT)."""
    return f"{PREFIX}:trace:{check_trace_id(trace_id)}:stats"


def legacy_stop(trace_id: str) -> str:
    """Layout 1: string, present while a stop was requested."""
    return f"{PREFIX}:trace:{check_trace_id(trace_id)}:stop"


LEGACY_SUFFIXES = ("messages", "stats", "stop")
"""The last part of each layout-1 key, in the order `fleet migrate` passes them."""


def collaborators(trace_id: str) -> str:
    """Hash: child trace id -> Collaborator JSON (one field per child: atomic per child)."""
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:collaborators"


def collaborator_order(trace_id: str) -> str:
    """List: child trace ids in the order their collaborator entries were first added."""
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:collaborator-order"


def children(trace_id: str) -> str:
    """Sorted set: child trace ids scored by creation time."""
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:children"


def events(root_trace_id: str) -> str:
    """Stream: the events of a whole trace tree, read by watch/run/batch."""
    return f"{PREFIX}:trace:{_tree_id(root_trace_id)}:events"


def events_archive(root_trace_id: str) -> str:
    """String with the retention TTL: a finished tree's events, packed, once its stream is gone.

    Written by compaction (`fleet.storage.backends.redis.compact`); read where the stream
    has nothing.
    """
    return f"{PREFIX}:trace:{_tree_id(root_trace_id)}:events-archive"


def imported(root_trace_id: str) -> str:
    """String with the retention TTL: the digest of the tree `fleet archive --import` wrote.

    Set before its first trace, so an import cut short may be run again over the traces it
    left, and only the same tree may (`fleetops.archive_checks`).
    """
    return f"{PREFIX}:trace:{_tree_id(root_trace_id)}:imported"


def tree_dict(root_trace_id: str) -> str:
    """String with the retention TTL: the text a compacted tree's traces are packed against.

    base64 (`fleet.storage.compaction.TreeDict`); set once per tree (SET NX), its TTL renewed
    by each compaction of the tree, so it outlives every trace packed against it.
    """
    return f"{PREFIX}:trace:{_tree_id(root_trace_id)}:dict"


def inbox(trace_id: str) -> str:
    """Stream with TRACE_TTL_S (renewed by each message): messages sent to this running trace.

    One entry per message, field `m` the `fleet.storage.inbox.Posted` JSON (sender, its
    conversation id, the text, whether it interrupts); written by `fleet send`, the API, the
    MCP tool and `send_message` (`fleet.conversation.messages`). Entries are never removed:
    how far the trace has read is kept in the trace's own messages (their `messages_read`
    and `messages_announced` metadata), written with them under the run's lease.
    """
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:inbox"


def message_sends(trace_id: str) -> str:
    """String (a counter), 60 s TTL from its first increment: this trace's `send_message`s.

    The fan-out cap counts them per minute (`fleet.conversation.between`).
    """
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:message-sends"


def lease(trace_id: str) -> str:
    """String with PX TTL: the id of the one live runner of this trace."""
    return f"{PREFIX}:lease:{_tree_id(trace_id)}"


def worker(node: str) -> str:
    """String with PX TTL (the lease TTL): a live worker's presence, JSON `WorkerPresence`."""
    return f"{PREFIX}:worker:{node}"


def consumers(queue: str) -> str:
    """Sorted set: node names of the workers consuming `queue`, scored by presence deadline.

    In ms; entries dead for a minute are trimmed by every heartbeat.
    """
    return f"{PREFIX}:consumers:{queue}"


def collected(trace_id: str, tool_call_id: str) -> str:
    """String: set once when a tool call's children were collected (dedupes redelivery)."""
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:collected:{tool_call_id}"


def cache(preset: str, digest: str) -> str:
    """String with TTL: a cached sub-agent answer for a preset and argument digest."""
    return f"{PREFIX}:cache:{preset}:{digest}"


def search_cache(digest: str) -> str:
    """String with the preset's `cache.ttl_s`: a `web_search` answer (results as JSON).

    The digest covers the provider (its address and key's digest), the query and the count.
    """
    return f"{PREFIX}:search-cache:{digest}"


TRACES = f"{PREFIX}:traces"
"""Sorted set: every trace id scored by creation time (newest last)."""

ROOTS = f"{PREFIX}:roots"
"""Sorted set, no TTL: root trace ids scored by creation time (newest last), for lists of
whole trees (`fleet.storage.root_index`); an entry whose trace expired is dropped by the
reader that finds it gone."""

RUNNING = f"{PREFIX}:running"
"""Sorted set: trace ids in status running, scored by their lease deadline in ms."""

HUMAN_WAITS = f"{PREFIX}:human-waits"
"""Sorted set, no TTL: trace ids waiting on a person (`ask_human`, an approval), scored by
the deadline in ms after which the wait ends with a timeout result; an answer removes its
entry, and whoever removes it (reply, approve, deny, the sweeper) is the one that answers."""

EXPERIENCES = f"{PREFIX}:experiences"
"""Hash, no TTL: experience id -> Experience JSON (`fleet.experiences`), counts excluded."""

EXPERIENCES_VERSION = f"{PREFIX}:experiences-version"
"""String (a counter), no TTL: raised with every put or removal of an experience, in the
same transaction; a process's cache of the approved ones (`fleet.experiences.backends.
redis`) holds while this and the hash's length read as when it was filled."""

EXPERIENCE_COUNTS = f"{PREFIX}:experience-counts"
"""Hash, no TTL: `{id}:uses` and `{id}:successes`, added to with HINCRBY (one writer each)."""

EXPERIENCE_VECTORS = f"{PREFIX}:experience-vectors"
"""Hash, no TTL: experience id -> its embedding (`StoredVector` JSON: model, text digest,
float32 base64), written when it is approved or first ranked; read only when fleet.yaml
names an `experiences.embedding_model`."""


def experiences_used(trace_id: str) -> str:
    """List with TRACE_TTL_S: the experience ids injected into this trace.

    Taken (once) when the trace ends, to count their successes.
    """
    return f"{PREFIX}:experiences-used:{_tree_id(trace_id)}"


USAGE = f"{PREFIX}:usage"
"""Hash, no TTL: fleet-wide model usage for `fleet metrics`, one field per `{kind}:{model}`
(kind prompt_tokens, completion_tokens, cached_tokens or cost_usd); added to once per run,
by the write that ends it (a status other than running), from the trace's `uncounted`
field: a run that died leaves its calls there for the trace's next run to add."""

MODEL_FALLBACKS = f"{PREFIX}:model-fallbacks"
"""Hash, no TTL: fleet-wide model fallbacks for `fleet metrics`: the JSON `[from, to]` of the
two model names -> how many traces moved from one to the other (`fleet.llm.fallback`)."""

COUNTERS = f"{PREFIX}:counters"
"""Hash, no TTL: fleet-wide event counts for `fleet metrics`, one field per `CounterName`."""
CounterName = Literal[
    "lease_expiries",
    "resumes",
    "stuck_traces",
    "batch_calls_sent",
    "batch_answers",
    "batch_retries",
]
"""The fields of `COUNTERS`: runs re-enqueued after their lease expired, parents resumed,
non-terminal traces the owner check found with nothing to move them (`fleet.owners`), calls
sent in provider batches, answers they brought back, calls sent again (`fleet.batchapi`)."""

OPEN_TREES = f"{PREFIX}:open-trees"
"""Sorted set, no TTL: root trace ids whose tree may still have a non-terminal trace, scored
by when they were (re)opened in ms; the owner check (`fleet.owners`) removes a tree once
every trace of it ended, or once its root is gone (expired)."""

OWNER_CHECK = f"{PREFIX}:owner-check"
"""String with TTL: which worker runs the fleet's owner check this interval (SET NX PX)."""

OUTBOX = f"{PREFIX}:outbox"
"""Sorted set, no TTL: work to hand to the queue (`fleet.storage.outbox` entries: a spawn whose
children are created but not yet dispatched, a recovered run not yet re-sent), scored by
when a sweeper may do it (ms)."""


IMAGE_MAX_BYTES = 5_000_000
"""Largest image a key holds (`fleet.tools.imagecheck.MAX_IMAGE_BYTES`, before base64)."""
IMAGE_TREE_MAX_BYTES = 50_000_000
"""Most image bytes one tree may store (an agent reading image after image is refused)."""


def image_bytes(root_trace_id: str) -> str:
    """String (a counter), TRACE_TTL_S: the bytes of the images this tree stored so far."""
    return f"{PREFIX}:image-bytes:{_tree_id(root_trace_id)}"


def image(root_trace_id: str, digest: str) -> str:
    """String with TRACE_TTL_S (refreshed by each read and write): one image's bytes, base64.

    Named by the SHA-256 of the bytes, per tree: the same image attached or read twice in
    a tree is stored once; messages hold an `image_ref` part naming it, never the bytes.
    """
    root = _tree_id(root_trace_id)
    if not _DIGEST.fullmatch(digest):
        raise ValueError(f"image digest {digest[:80]!r} is not a digest")
    return f"{PREFIX}:image:{root}:{digest}"


_DIGEST = re.compile(r"[A-Za-z0-9_-]{1,64}")
