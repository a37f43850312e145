"""Provider batches (fleet.batchapi, fleet.storage.batch_calls): their Redis keys.

The keys the provider-batch queue owns, grouped by their owner as `keys.limits` groups the
limits'; importable from `fleet.storage.keys` like every other key. Functions, not
constants: a name depends on the layout, set at start-up.
"""

from __future__ import annotations

from fleet.storage.keys.layout import LAYOUT, PREFIX

BATCH_TAG = "{batch}"
"""In the cluster layout every batch key carries this hash tag: one slot, so each move of a
call (one Lua script over several batch keys) runs on one node of a cluster too."""


def _batch(name: str) -> str:
    """`fleet:batch:{name}`; `fleet:{batch}:{name}` in the cluster layout."""
    return f"{PREFIX}:{BATCH_TAG if LAYOUT['cluster'] else 'batch'}:{name}"


def batch_calls() -> str:
    """Hash: custom id -> PendingCall JSON, a model call routed through a Batch API.

    Held from the moment it is queued until its trace was resumed with the answer (or ended).
    """
    return _batch("calls")


def batch_state() -> str:
    """Hash: custom id -> CallStatus JSON; each move is one Lua script.

    The status (queued|submitting|submitted|answered|cancelled), the attempt, the flush or
    batch holding it.
    """
    return _batch("state")


def batch_queued() -> str:
    """Sorted set: custom ids waiting for the next provider batch, scored by queued_at_ms."""
    return _batch("queued")


def batch_deadlines() -> str:
    """Sorted set: ids of calls whose tree has a `wall_s` budget, scored by its deadline (ms).

    The poller cancels what is past it without reading every call.
    """
    return _batch("deadlines")


def batch_submitting() -> str:
    """Hash: flush id -> Flush JSON, written BEFORE the upload: the calls it moved out.

    A flush left here (the poller died mid-upload) is reconciled with the provider.
    """
    return _batch("submitting")


def batch_in_flight() -> str:
    """Hash: provider batch id -> Flush JSON (its calls, provider, submitted_at_ms)."""
    return _batch("in-flight")


def batch_poll() -> str:
    """String, PX = FLEET_BATCH_POLL_S: the claim of the one worker that polls this interval."""
    return _batch("poll")


def batch_polling() -> str:
    """String, PX = 10 poll intervals (at least 5 s): held while a poll runs.

    So two polls do not overlap (`fleet.batchapi.poller.poll_fleet`).
    """
    return _batch("polling")


def batch_wake() -> str:
    """List, PX 60 s: a stop cancelled a call in a provider batch; a worker's waker pops it.

    The worker that pops it cancels at the provider every batch whose calls were all
    cancelled, at once rather than at the next poll (`fleet.batchapi.poller.cancel_stopped`).
    """
    return _batch("wake")


def batch_answer(custom_id: str) -> str:
    """String, TRACE_TTL_S: the provider's answer (or error) to one call, until consumed."""
    if not custom_id.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"not a batch custom id: {custom_id!r}")
    return _batch(f"answer:{custom_id}")
