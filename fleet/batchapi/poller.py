"""The fleet's one poller: reconcile lost flushes, send due calls, read finished batches.

`poll_once` is run by one worker per `FLEET_BATCH_POLL_S` (a Celery task behind a Redis
claim, `workers/batch_poll.py`) and returns the traces to send to a worker: those whose
call was answered (or that go live, or whose time budget ran out). Its steps, each safe
to repeat after a crash at any line:

1. A flush record left by a poller that died mid-upload is looked up at the provider by
   its flush id (`find`): adopted if the provider has it, else its calls are queued again
   under their next attempt (new wire ids).
2. The queue is sent when its oldest call is `FLEET_BATCH_FLUSH_S` old or a batch is full,
   one batch per model, within the provider's request and byte limits. The flush record
   is written before the upload and swapped for the in-flight record after it.
3. Every batch in flight is polled; an ended one's answers are stored once per call, each
   trace is resumed, an errored request is retried (next batch, or live:
   `FLEET_BATCH_RETRY`), and a batch that expired or was cancelled sends what it held
   again. A batch whose every call was cancelled (its tree stopped) is cancelled at the
   provider.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from fleet import lifecycle
from fleet.batchapi.lines import Outcome
from fleet.batchapi.providers import BatchProvider, ProviderFactory
from fleet.batchapi.route import answer_of, parked_call
from fleet.errors import FleetError, TraceNotFound
from fleet.models import now_ms
from fleet.runstate import BatchCallState
from fleet.runtime import Runtime
from fleet.storage import keys
from fleet.storage.batch_calls import (
    BatchCalls,
    CallStates,
    Flush,
    Flushes,
    PendingCall,
    batch_calls,
)

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
"""A call sent this many times without an answer is made live (or fails with it)."""
OVERDUE_PER_POLL = 1_000
FLUSHES_PER_POLL = 4


@dataclass
class Poll:
    """What one poll did: the traces to send, and counts for logs and tests."""

    resume: list[str] = field(default_factory=list)
    sent: int = 0
    answered: int = 0
    retried: int = 0
    batches: list[str] = field(default_factory=list)


POLLS_PER_POLLING_CLAIM, MIN_POLLING_CLAIM_S = 10, 5.0
"""A poll holds `keys.batch_polling()` for 10 poll intervals (at least 5 s): a poller that died
lets go then. A poll that outlives it may overlap the next one; every move is atomic and
every resume checks the trace, so an overlap costs reads, not a second submission."""


def poll_fleet(runtime: Runtime, providers: ProviderFactory, owner: str) -> Poll | None:
    """`poll_once`, unless another poll runs now (None)."""
    calls = batch_calls(runtime.store)
    ttl_s = max(runtime.settings.batch_poll_s * POLLS_PER_POLLING_CLAIM, MIN_POLLING_CLAIM_S)
    if not calls.claim(keys.batch_polling(), owner, int(ttl_s * 1000)):
        return None
    try:
        return poll_once(runtime, providers)
    finally:
        calls.unclaim(keys.batch_polling(), owner)


def claim_poll(runtime: Runtime, owner: str) -> bool:
    """True for one worker of the fleet per `FLEET_BATCH_POLL_S`, when there is work.

    Work: a call queued, a flush to reconcile or a batch in flight; a fleet that uses no
    provider batch sends no poll.
    """
    calls = batch_calls(runtime.store)
    if not (calls.queued(1) or calls.submitting() or calls.in_flight()):
        return False
    ttl_ms = int(runtime.settings.batch_poll_s * 1000)
    return calls.claim(keys.batch_poll(), owner, ttl_ms)


def poll_once(runtime: Runtime, providers: ProviderFactory) -> Poll:
    """Reconcile, flush, poll; see the module doc. Provider errors are logged, not raised."""
    calls = batch_calls(runtime.store)
    poll = Poll()
    for flush in calls.submitting():
        _reconcile(runtime, calls, providers, flush)
    _end_overdue(runtime, calls, poll)
    _flush(runtime, calls, providers, poll)
    for flush in calls.in_flight():
        try:
            _read(runtime, calls, providers(flush.model_name), flush, poll)
        except FleetError as exc:  # the provider is away or confused: next poll
            log.warning("batch %s of %s: %s", flush.batch_id, flush.model_name, exc)
    if poll.sent:
        runtime.store.count("batch_calls_sent", poll.sent)
    if poll.answered:
        runtime.store.count("batch_answers", poll.answered)
    if poll.retried:
        runtime.store.count("batch_retries", poll.retried)
    return poll


def cancel_stopped(runtime: Runtime, providers: ProviderFactory) -> list[str]:
    """Cancel at the provider every batch in flight whose every call was stopped; their ids.

    Run by the worker a stop woke (`BatchCalls.woken`), at once; a poll does the same for
    a running batch (`_read`), should no worker have heard the wake. A batch the provider
    ended meanwhile refuses the cancel (logged); the next poll reads it as usual.
    """
    calls = batch_calls(runtime.store)
    cancelled: list[str] = []
    for flush in calls.in_flight():
        states = {st.state for st in calls.statuses(flush.custom_ids) if st is not None}
        if states != {"cancelled"}:
            continue  # another tree's call is in it (the batch goes on), or it is read now
        try:
            providers(flush.model_name).cancel(flush.batch_id)
        except FleetError as exc:
            log.warning("cancel of stopped batch %s: %s", flush.batch_id, exc)
            continue
        cancelled.append(flush.batch_id)
    return cancelled


def _reconcile(runtime: Runtime, calls: Flushes, providers: ProviderFactory, flush: Flush) -> None:
    """A flush whose upload was never recorded: adopt the provider's batch, or send again."""
    try:
        found = providers(flush.model_name).find(flush.flush_id, flush.at_ms, len(flush.custom_ids))
    except FleetError as exc:
        log.warning("flush %s: cannot ask the provider yet: %s", flush.flush_id, exc)
        return
    if found is not None:
        calls.submitted(flush.model_copy(update={"batch_id": found}))
        log.warning("flush %s: adopted provider batch %s", flush.flush_id, found)
        return
    calls.requeue(flush.custom_ids, now_ms())
    calls.drop_flush(flush.flush_id)
    log.warning(
        "flush %s: the provider has no such batch; its calls are queued again", flush.flush_id
    )


def _flush(runtime: Runtime, calls: BatchCalls, providers: ProviderFactory, poll: Poll) -> None:
    """Send the queue, one batch per model, if its oldest call waited long enough or it is full."""
    settings = runtime.settings
    # Bodies are read only for what one poll may send: a few full batches.
    queued = calls.queued(settings.batch_max_requests * FLUSHES_PER_POLL)
    if not queued:
        return
    oldest_ms = queued[0][1]
    if (
        now_ms() - oldest_ms < settings.batch_flush_s * 1000
        and len(queued) < settings.batch_max_requests
    ):
        return
    by_model: dict[str, list[PendingCall]] = defaultdict(list)
    for call in calls.calls([c for c, _ in queued]):
        if call is not None:
            by_model[call.model_name].append(call)
    for model_name, pending in by_model.items():
        try:
            provider = providers(model_name)
        except FleetError as exc:  # its provider lost its batch API: every call goes live
            log.warning("model %s: %s", model_name, exc)
            _go_live(runtime, calls, [c.custom_id for c in pending], poll)
            continue
        for chunk in _chunks(provider, pending, settings.batch_max_requests):
            _send(runtime, calls, provider, model_name, chunk, poll)


def _chunks(
    provider: BatchProvider, pending: list[PendingCall], max_requests: int
) -> list[list[tuple[PendingCall, dict[str, Any]]]]:
    """The calls as provider requests, cut by the request count and byte limits."""
    limit = min(max_requests, provider.max_requests)
    chunks: list[list[tuple[PendingCall, dict[str, Any]]]] = [[]]
    size = 0
    for call in pending:
        request = provider.request(call.body)
        length = len(json.dumps(request)) + 200  # the line's envelope
        if chunks[-1] and (len(chunks[-1]) >= limit or size + length > provider.max_bytes):
            chunks.append([])
            size = 0
        chunks[-1].append((call, request))
        size += length
    return chunks


def _send(
    runtime: Runtime,
    calls: BatchCalls,
    provider: BatchProvider,
    model_name: str,
    chunk: list[tuple[PendingCall, dict[str, Any]]],
    poll: Poll,
) -> None:
    """One provider batch: recorded as submitting, uploaded, recorded as in flight."""
    flush = Flush(
        flush_id=uuid.uuid4().hex,
        model_name=model_name,
        custom_ids=[c.custom_id for c, _ in chunk],
        at_ms=now_ms(),
    )
    moved = set(calls.begin_flush(flush))  # a call cancelled meanwhile is not sent
    requests = {c.custom_id: (c, r) for c, r in chunk if c.custom_id in moved}
    ids = list(requests)
    statuses = calls.statuses(ids)
    over = [
        i
        for i, st in zip(ids, statuses, strict=True)
        if st is not None and st.attempt > MAX_ATTEMPTS
    ]
    if over:  # sent often enough: these go live, the rest goes now
        _go_live(runtime, calls, over, poll)
        ids = [i for i in ids if i not in over]
    attempts = {i: st.attempt for i, st in zip(list(requests), statuses, strict=True) if st}
    wire_ids = [f"{i}-{attempts.get(i, 1)}" for i in ids]
    flush = flush.model_copy(update={"custom_ids": ids, "wire_ids": wire_ids})
    if not ids:
        calls.drop_flush(flush.flush_id)
        return
    lines = [(w, requests[i][1]) for w, i in zip(wire_ids, ids, strict=True)]
    try:
        batch_id = provider.submit(lines, flush.flush_id)
    except FleetError as exc:  # left for the next poll to reconcile (it may have gone)
        log.warning(
            "flush %s of %d calls to %s failed: %s", flush.flush_id, len(ids), model_name, exc
        )
        return
    calls.submitted(flush.model_copy(update={"batch_id": batch_id}))
    poll.sent += len(ids)
    poll.batches.append(batch_id)
    for call, _ in requests.values():
        if call.custom_id in ids:
            _show(runtime, call, batch_id)


def _show(runtime: Runtime, call: PendingCall, batch_id: str) -> None:
    """The trace's batch entry names the provider batch now holding its call."""
    try:
        trace = runtime.store.get_trace(call.trace_id)
    except TraceNotFound:
        return
    if trace.status == "waiting":
        lifecycle.put_batch(runtime, trace, "waiting", f"in provider batch {batch_id}", batch_id)


def _read(
    runtime: Runtime, calls: BatchCalls, provider: BatchProvider, flush: Flush, poll: Poll
) -> None:
    """Poll one batch; an ended (or lost) one is read to its end and forgotten."""
    statuses = calls.statuses(flush.custom_ids)
    live = [st for st in statuses if st is not None and st.state != "cancelled"]
    phase = provider.phase(flush.batch_id)
    if phase == "running":
        if not live:  # every call of it was stopped: the provider may stop too
            provider.cancel(flush.batch_id)
        return
    wanted = {
        f"{custom_id}-{status.attempt}"
        for custom_id, status in zip(flush.custom_ids, statuses, strict=True)
        if status is not None and status.batch_id == flush.batch_id
    }
    # Only this batch's own wire ids are kept: a line naming any other custom id (another
    # flush's, or one the provider made up) answers nothing (`fleet.batchapi.lines`).
    results = provider.results(flush.batch_id, wanted)
    for custom_id, status in zip(flush.custom_ids, statuses, strict=True):
        if status is None or status.batch_id != flush.batch_id:
            continue  # forgotten, or queued again since: not this batch's to answer
        # Its attempt is the one this batch carries (a requeue would have moved it out); an
        # adopted flush's record was written before its wire ids were.
        wire_id = f"{custom_id}-{status.attempt}"
        if status.state == "cancelled":
            calls.forget(custom_id)
            continue
        _settle(runtime, calls, provider, flush.batch_id, custom_id, results.get(wire_id), poll)
    calls.batch_done(flush.batch_id)


def _settle(
    runtime: Runtime,
    calls: BatchCalls,
    provider: BatchProvider,
    batch_id: str,
    custom_id: str,
    outcome: Outcome | None,
    poll: Poll,
) -> None:
    """Store one call's answer and resume its trace; or retry it."""
    if outcome is not None and outcome.body is not None:
        try:
            response = provider.parse(outcome.body)
        except FleetError as exc:  # a malformed answer is an errored request
            outcome = Outcome(error=str(exc))
        else:
            calls.answer(custom_id, answer_of(response, batch_id))
            if _resume(runtime, calls, custom_id, "answered", batch_id, poll):
                poll.answered += 1
            return
    poll.retried += 1
    if outcome is None or runtime.settings.batch_retry == "batch":  # lost, or the choice
        calls.requeue([custom_id], now_ms())
        return
    _go_live(runtime, calls, [custom_id], poll)


def _go_live(runtime: Runtime, calls: CallStates, custom_ids: list[str], poll: Poll) -> None:
    """These calls leave the batch route: their traces make them live on a worker."""
    for custom_id in custom_ids:
        _resume(runtime, calls, custom_id, "live", None, poll)
        calls.forget(custom_id)


def _resume(
    runtime: Runtime,
    calls: CallStates,
    custom_id: str,
    state: BatchCallState,
    batch_id: str | None,
    poll: Poll,
) -> bool:
    """Queue the trace waiting on this call (once); False if it no longer waits on it."""
    (call,) = calls.calls([custom_id])
    trace_id = call.trace_id if call is not None else None
    if trace_id is None:
        return False
    try:
        trace = runtime.store.get_trace(trace_id)
    except TraceNotFound:
        calls.forget(custom_id)
        return False
    parked = parked_call(trace)
    if trace.is_terminal or parked is None or parked.custom_id != custom_id:
        calls.forget(custom_id)  # stopped, or moved on: the answer has no reader
        return False
    if trace.status != "waiting" or parked.state != "parked":
        return False  # resumed already (an earlier poll that died before it let go)
    lifecycle.batch_answered(runtime, trace, state, batch_id)
    poll.resume.append(trace_id)
    calls.release(custom_id)
    return True


def _end_overdue(runtime: Runtime, calls: CallStates, poll: Poll) -> None:
    """A call of a tree whose `wall_s` ran out is cancelled; its trace runs to its budget stop."""
    overdue = calls.overdue(now_ms(), OVERDUE_PER_POLL)
    for custom_id, call in zip(overdue, calls.calls(overdue), strict=True):
        calls.cancel(custom_id)
        if call is not None:
            _resume_cancelled(runtime, call, poll)


def _resume_cancelled(runtime: Runtime, call: PendingCall, poll: Poll) -> None:
    try:
        trace = runtime.store.get_trace(call.trace_id)
    except TraceNotFound:
        return
    parked = parked_call(trace)
    if trace.status == "waiting" and parked is not None and parked.custom_id == call.custom_id:
        lifecycle.batch_answered(runtime, trace, "cancelled", None)
        poll.resume.append(call.trace_id)
