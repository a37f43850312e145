"""The fleet's chord join: each header part counted once, for chords whose body is collect.

The `fleet-join` patch (`workers.patches.switches`), written and tested against Celery
5.7.0 (redis-py 8.1.0). It relies on: `BaseBackend.mark_as_done` and `mark_as_failure`
calling `on_chord_part_return(request, state, result)` for every header with
`request.chord` (the body as a dict), `ignore_result` or not; the request's `id`, `group`,
`group_index` and `args`; `backend.get_key_for_group(group_id, suffix)` (bytes, prefixed
`celery-taskset-meta-`); `backend.chord_expires`; `backend.chord_error_from_stack(callback,
exc)` running the errbacks; `app.amqp._retry_publish(publish, *args)` as Celery's join
sends the body; and Celery 5.7 keeping a chord's size in a `.s` key, not in the message.
tests/test_celery_patches.py asserts each of them on Celery.

Switched off, `workers.dispatch` sends chords without the size, so they get Celery's own
Redis join (a chord sent before keeps the join it was sent with). **This changes
correctness**: Celery's join has no outbox net (a claimer that dies before publishing the
body leaves the call until a redelivered part claims again, after the visibility timeout,
or the owner check heals it), it stores and decodes every header's result, and a run's
part costs a round trip of its own (no `count_in_run`).

Celery's Redis join (`RedisBackend.on_chord_part_return`) serves any chord: it stores every
header result, then per part runs a script of ~13 commands (a done-marker `GET`, `SISMEMBER`,
`ZADD`, `SADD`, `ZCOUNT`, 5 `EXPIRE`, 2 `GET` of the size keys) and decodes every result to
hand them to the body. The fleet's chord (`workers.dispatch.CeleryDispatcher.dispatch`:
header `fleet.run_agent` per child, body `fleet.children.collect(parent_trace_id, tool_call_id)`,
errback `fleet.collect_failed`) needs only each header's trace id, and its collect is
exactly-once on its own (`fleet.children.settling.settle`: the tool result is written with its
once-mark). So its headers store no result (`ignore_result`) and their parts are joined
here, with the size the sender put in the body's options (`SIZE_OPTION`: Celery 5.7 no
longer carries `chord_size` in the message and keeps the size in a `.s` key instead, which
this join never reads, so `SendOnlyRedisBackend` does not write it for these chords).

A run that ends its trace counts its own part in the write that ends it (`count_in_run`:
`JOIN_PART` is registered as the store's write extension `EXTENSION`, and the runner's
last write runs it as its `end_step`: the runtime only knows an opaque
`fleet.storage.writes.WriteExtension`), so a branch's part costs no round trip of its own;
`part_returned` then only sends the body if that write claimed it. Every other part (a run
that waits, yields, is throttled or fenced, a task that failed) is recorded when Celery
reports it, as below.

A part (`PART_RETURN`): recorded once per header task id (a redelivered or re-sent header,
`requeue` and Celery's retry keep the id, counts once), counted, and when the count reaches
the size the body is claimed (`SET NX` with a lease of JOIN_CLAIM_S) and the parts are
returned. The claimer publishes the body (`collect([{"trace_id": ...}, ...], parent,
call)`, the shape Celery's join gave it, in header order), then marks the chord done and
deletes its parts in one transaction. As in Celery's join, a claimer that dies before
publishing leaves the parts: a redelivered part after the lease claims and publishes again.
Unlike Celery's, the claim also owes the call to the fleet's outbox until the chord is
marked done (`owed_settlement`): a copy of the part may come back while the claim still
holds (it then fires nothing), or only after the visibility timeout, and a sweeper settles
the call from the children's own state meanwhile.
A header part in a failure state (FAILURE, REVOKED) counts like any other; when the chord
is complete the body is not sent and its errback runs through Celery's own
`chord_error_from_stack`, as Celery's join does on such a part.

Every other chord (the bench's peer chords, a user's chords on this app) and a fleet chord
sent without the size (a sender of an older release) keep Celery's join untouched.

Keys. They are Celery group keys, so they live here rather than in `fleet/storage/keys/`: named
by a Celery group id with the backend's `celery-taskset-meta-` prefix (and its
`global_keyprefix`), with Celery's `result_chord_expires` (else `result_expires`, 24 h
here) as TTL, and only the Celery binding knows them:

- `celery-taskset-meta-{group}.fj`: hash, header task id -> JSON `[group_index, trace_id,
  failure or null]`; TTL refreshed with every new part; deleted once the body is sent.
- `celery-taskset-meta-{group}.fc`: string, `claimed` (JOIN_CLAIM_S) while the body is being
  sent, then `done` for `done_ttl_s` (the broker's redelivery window, not the TTL): set
  after the parts are gone, so it outlives them and a late copy of a part (even of a
  chord of one) finds the chord done and fires nothing.

Nothing else of a fleet chord stays in Celery's backend: its headers and its body
(`fleet.collect`, and its errback) store no result.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import states
from celery.canvas import Signature, maybe_signature
from celery.exceptions import ChordError

from fleet.models import now_ms
from fleet.storage import keys, outbox
from fleet.storage.backends.redis import scripts as redis_scripts
from fleet.storage.outage import is_outage, warn_failed
from fleet.storage.writes import WriteExtension

logger = logging.getLogger(__name__)

BODY_TASK = "fleet.collect"
"""The body of the chords joined here."""

SIZE_OPTION = "chord_size"
"""The body's option holding the number of header tasks (set by the sender)."""

PARTS_SUFFIX = ".fj"
CLAIM_SUFFIX = ".fc"

JOIN_CLAIM_S = 10
"""How long a claimer has to publish the body before a later copy of a part may (Celery's
join claim: twice its default `result_chord_join_timeout`). Unlike Celery's, it is not
extended while the publish retries: a publish slower than this (broker failover) can let a
late copy send a second `collect`, and the outbox's sweeper settle after OWED_AFTER_MS;
both are harmless because settling a call is exactly-once (`fleet.children.settling.settle`)."""

OWED_AFTER_MS = 2 * JOIN_CLAIM_S * 1000
"""When a sweeper settles a call whose claimer did not mark its chord done (see
`owed_settlement`): after a later copy of a part could have claimed it."""

DEFAULT_VISIBILITY_S = 3600
"""kombu's `visibility_timeout` when the broker options name none."""

DEFAULT_TTL_S = 24 * 3600
"""The join keys' TTL when the backend has no `chord_expires` (results never expire)."""

DONE_AFTER_REDELIVERY_S = 600
"""How long the done marker outlives the broker's redelivery window (`done_ttl_s`)."""

FAILURE_CHARS = 300
"""A failed part's exception, as kept for the errback's ChordError message."""

COUNTED_ATTR = "fleet_join_part"
"""The request attribute holding the part a run counted in its last write (`count_in_run`)."""

JOIN_PART = """
local function join_part(parts, claim, outbox, member, part, size, ttl, claim_s, owed, due_ms)
  local added = redis.call('HSETNX', parts, member, part)
  local count = redis.call('HLEN', parts)
  if added == 1 then
    if count == 1 and redis.call('EXISTS', claim) == 1 then
      redis.call('DEL', parts)
      return false
    end
    redis.call('EXPIRE', parts, ttl)
  end
  if count < tonumber(size) or not redis.call('SET', claim, 'claimed', 'NX', 'EX', claim_s) then
    return false
  end
  redis.call('ZADD', outbox, due_ms, owed)
  return redis.call('HVALS', parts)
end
"""
"""A part: `member`'s part recorded once; when `size` parts are in, the body is claimed
(`claim` SET NX with a lease of `claim_s`), owed to `outbox` (`owed` due at `due_ms`) and
every part returned; else false. A first part finding the claim there is a late copy after
the body was sent: it is dropped. The store's write extension `EXTENSION` and
`PART_RETURN` both run it."""

EXTENSION = "fleet-chord-join"
"""`JOIN_PART` as a write extension of the Redis store (registered when this is imported)."""

PART_RETURN = JOIN_PART + "return join_part(KEYS[1], KEYS[2], KEYS[3], unpack(ARGV))"
"""Record a part once per task id; on the last one claim the body, owe its settlement to the
outbox (`owed`, due `due_ms`) and return every part."""

redis_scripts.register_write_extension(EXTENSION, JOIN_PART, "join_part")


def is_fleet_join(body: Any) -> bool:
    """A chord body (signature or its message dict) that this join handles."""
    if not isinstance(body, dict) or body.get("task") != BODY_TASK:
        return False
    return SIZE_OPTION in (body.get("options") or {})


def parts_key(backend: Any, group_id: str) -> str:
    """The hash of a chord's recorded parts."""
    return _group_key(backend, group_id, PARTS_SUFFIX)


def claim_key(backend: Any, group_id: str) -> str:
    """The body's claim, then the chord's done marker."""
    return _group_key(backend, group_id, CLAIM_SUFFIX)


def _group_key(backend: Any, group_id: str, suffix: str) -> str:
    key = backend.get_key_for_group(group_id, suffix)  # bytes (Celery's `key_t`)
    return key.decode() if isinstance(key, bytes) else str(key)


def ttl_s(backend: Any) -> int:
    """Celery's chord key TTL (`result_chord_expires`, else `result_expires`)."""
    return int(backend.chord_expires or DEFAULT_TTL_S)


def done_ttl_s(backend: Any) -> int:
    """How long a chord's done marker stays: as long as a late copy of a part may come back.

    A copy of a header part comes back at the latest one `visibility_timeout` after its
    delivery (Redis keeps it unacked that long; `workers.app` sets it above the longest
    run), which was before the chord was done: the marker stays that long and
    DONE_AFTER_REDELIVERY_S more, never longer than the chord's keys (`ttl_s`). Kept for
    `ttl_s`, a marker per explore outlived its chord by a day (the soak's Redis growth).
    """
    options = backend.app.conf.broker_transport_options or {}
    window = int(options.get("visibility_timeout") or DEFAULT_VISIBILITY_S)
    return min(ttl_s(backend), window + DONE_AFTER_REDELIVERY_S)


def part_of(request: Any, state: str, result: Any) -> str:
    """What a header part leaves: its header index, its trace id, why it failed (or null).

    A run returns its envelope (`{trace_id, outcome}`: what `collect` reads); a part that
    failed (or anything else) has the trace id of the run's one argument.
    """
    failure = repr(result)[:FAILURE_CHARS] if state in states.PROPAGATE_STATES else None
    envelope = result if isinstance(result, dict) and failure is None else {}
    trace_id = envelope.get("trace_id") or (request.args or [""])[0]
    return json.dumps([request.group_index, str(trace_id), failure])


def part_returned(backend: Any, request: Any, state: str, result: Any) -> None:
    """Record one header part; the part that completes the chord sends its body (or errback).

    A run that counted its part in its last write (`count_in_run`) has nothing to record;
    the parts its write claimed are sent once (Celery may report a request twice: a
    failure while reporting success is reported too).
    """
    counted = getattr(request, COUNTED_ATTR, None)
    if counted is not None and counted.applied:
        parts, counted.reply = counted.reply, None
    else:
        part = join_part(backend, request, state, result)
        if part is None:
            return
        parts = backend.fleet_join_script(backend.client, part.keys, part.args())
    if parts:
        send_body(backend, request.group, request.chord, parts)


def join_part(backend: Any, request: Any, state: str, result: Any) -> WriteExtension | None:
    """The part a header task leaves in its chord's join; None outside a fleet chord.

    `JOIN_PART`'s keys (the parts, the claim, the outbox) and its arguments from `member`
    on, the owed entry due OWED_AFTER_MS from when they are sent (not from now).
    """
    group_id, task_id = request.group, request.id
    if not group_id or not task_id or not is_fleet_join(request.chord):
        return None
    body = request.chord
    values = [
        task_id,
        part_of(request, state, result),
        int(body["options"][SIZE_OPTION]),
        ttl_s(backend),
        JOIN_CLAIM_S,
        owed_settlement(body),
    ]

    def args() -> list[str]:
        return [str(value) for value in (*values, now_ms() + OWED_AFTER_MS)]

    group_keys = [parts_key(backend, group_id), claim_key(backend, group_id), keys.OUTBOX]
    return WriteExtension(EXTENSION, group_keys, args)


def count_in_run(
    backend: Any, request: Any, store_url: str, *, cluster: bool = False
) -> WriteExtension | None:
    """The part a run should count in its last write (its `end_step`), if any.

    A run that ends its trace returns its envelope: its part is known before it ends
    (a success, with the run's trace id), so the write that ends the trace records it, and
    `part_returned` then only sends the body when that write completed the chord: one
    round trip less per branch. Only where the join's keys and the store share one Redis
    (the result backend is the store's URL, as `workers.app` configures it). A run that
    does not end its trace (it waits, yields, is throttled, loses its lease, or fails
    outside the runner) writes no part, and `part_returned` records it as before; a part
    recorded twice (a redelivery after the run ended) counts once, by its task id.
    Never on a cluster store (`cluster`): the join's keys are named by the chord's group,
    not the tree, so they cannot share the trace's slot (its script would be refused).
    """
    if cluster or getattr(backend, "url", None) != store_url:
        return None
    part = join_part(backend, request, states.SUCCESS, None)
    if part is not None:
        setattr(request, COUNTED_ATTR, part)
    return part


def send_body(backend: Any, group_id: str, body: dict[str, Any], parts: list[Any]) -> None:
    """The claimer's send: the body (or the errback), then the chord marked done."""
    group_keys = [parts_key(backend, group_id), claim_key(backend, group_id)]
    sent = False
    try:
        sent = fire(backend, body, sorted_parts(parts))
    finally:  # unsent (the errback ran, or the send failed): done, and the call stays owed
        with backend.client.pipeline(transaction=True) as pipe:
            pipe.set(group_keys[1], "done", ex=done_ttl_s(backend)).delete(group_keys[0])
            if sent:
                pipe.zrem(keys.OUTBOX, owed_settlement(body))
            pipe.execute()


def owed_settlement(body: dict[str, Any]) -> str:
    """The outbox entry that settles the body's call if the claimer dies before it is sent.

    From the claim until the body is out and the chord marked done, the call is owed to
    the outbox (`fleet.storage.outbox.settle_entry`, in the claim's script): a claimer that dies
    there (its part comes back only after the visibility timeout, or within the claim,
    when it fires nothing) leaves the call to a sweeper, which settles it from the
    children's own state. Settling is exactly-once, so a body that did go out and the
    sweeper cannot both collect.
    """
    parent_trace_id, tool_call_id = body["args"][:2]
    return outbox.settle_entry(str(parent_trace_id), str(tool_call_id))


def sorted_parts(raw: list[Any]) -> list[list[Any]]:
    """The parts in header order (a part without an index last)."""
    parts = [json.loads(value) for value in raw]
    return sorted(parts, key=lambda p: (p[0] is None, p[0] or 0))


def fire(backend: Any, body: dict[str, Any], parts: list[list[Any]]) -> bool:
    """Send the body with every header's trace id (True), or run its errback if a part failed."""
    options = {k: v for k, v in body["options"].items() if k != SIZE_OPTION}
    callback: Signature = maybe_signature({**body, "options": options}, app=backend.app)
    failed = [p for p in parts if p[2] is not None]
    if failed:
        index, trace_id, failure = failed[0]
        try:  # Celery's errback path records the body's failure from the current exception
            raise ChordError(f"Dependency {index} (trace {trace_id!r}) raised {failure}")
        except ChordError as error:
            logger.error("Chord of %r failed: %s", body.get("args"), error)
            backend.chord_error_from_stack(callback, error)
        return False  # the errback may have owed the call to the outbox itself: keep it
    results = [{"trace_id": trace_id} for _, trace_id, _ in parts]
    try:
        backend.app.amqp._retry_publish(callback.delay, results)
    except Exception as exc:
        if broker_away(backend.app, exc):  # the call stays owed to the outbox (one line)
            warn_failed(logger, "Chord body %r not sent; a sweeper settles it", body.get("args"))
            return False
        # as Celery's join: a body that cannot be sent fails the chord
        logger.exception("Chord body %r could not be sent: %r", body.get("args"), exc)
        backend.chord_error_from_stack(callback, ChordError(f"Callback error: {exc!r}"))
        return False
    return True


def broker_away(app: Any, exc: BaseException) -> bool:
    """Whether `exc` says the broker (or the store) is away.

    An outage (`fleet.storage.outage`), or one of the errors kombu's transport declares
    for its connections and channels (py-amqp's `ConnectionForced`, `ChannelError`...
    while a RabbitMQ node restarts).

    A body not sent then is not the chord's failure: its errback would only meet the
    broker away again, resuming the parent (make chaos, seeds 38 round 29, 40 round 30,
    41 round 33: "Errback 'fleet.collect_failed' raised an exception" after this
    module's "could not be sent" traceback). The claim owed the call to the outbox, and
    `send_body` keeps that entry when the body was not sent: a sweeper settles the call
    from the children's own state once the broker is back.
    """
    if is_outage(exc):
        return True
    connection = app.connection_for_write()
    try:
        return isinstance(exc, (*connection.connection_errors, *connection.channel_errors))
    finally:
        connection.release()
