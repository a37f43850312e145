"""The second steps of the store's writes on Redis Cluster, where fleet-wide keys are elsewhere.

On a single Redis each write is one script over the trace's keys and the fleet-wide ones
(the running index, the usage counters, the traces index, the provider pauses). On a
cluster a script may touch one slot only: the trace's script runs alone (`split`), and what
it returns is done here, as commands of their own. A crash between the two steps leaves:

- the traces index without a new trace (it is not listed; `trace show` reads it by id);
- the running index without a lease (the holder's heartbeat adds it again within a second,
  and the owner check heals a trace whose runner died meanwhile) or with a released one (the
  sweeper finds no lease and drops it);
- the fleet-wide usage counters short by one run's calls (`fleet metrics` only);
- provider pauses are read apart from the write: a pause set in between is seen one call late.

The heartbeat renews a worker's leases with one small script per slot (a tree's leases share
its root's slot), all of them batched per node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.crc import key_slot
from redis.exceptions import NoScriptError

from fleet.storage import keys
from fleet.storage.backends.redis.connect import Lua
from fleet.storage.backends.redis.lease_scripts import RENEW_SLOT

_renew_slot = Lua(RENEW_SLOT)


def _renew_batch(client: redis.Redis, leases: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool]:
    """One `RENEW_SLOT` per slot the leases are in, sent in one cluster pipeline.

    Through `execute_command`: redis-py's cluster pipeline refuses its `evalsha` method
    outright (it cannot know the script's keys share a slot), but routes an EVALSHA sent
    as a command by its keys, refusing only keys of several slots, which these never are.
    """
    by_slot: dict[int, list[int]] = {}
    for index, (trace_id, _) in enumerate(leases):
        by_slot.setdefault(key_slot(keys.lease(trace_id).encode()), []).append(index)
    pipe = client.pipeline(transaction=False)
    for members in by_slot.values():
        lease_keys = [keys.lease(leases[i][0]) for i in members]
        owners = [leases[i][1] for i in members]
        command = ("EVALSHA", _renew_slot.sha, len(members), *lease_keys, ttl_ms, *owners)
        pipe.execute_command(*command)  # type: ignore[no-untyped-call]
    renewed = [False] * len(leases)
    for members, reply in zip(by_slot.values(), pipe.execute(), strict=True):
        for index, done in zip(members, reply, strict=True):
            renewed[index] = bool(done)
    return renewed


def count_usage(client: redis.Redis, counted: Sequence[Any]) -> None:
    """Add a run's usage (field, amount, ...) to the fleet-wide counters."""
    if not counted:
        return
    pipe = client.pipeline(transaction=False)
    for field, amount in zip(counted[0::2], counted[1::2], strict=True):
        if str(field).startswith("cost_usd:"):
            pipe.hincrbyfloat(keys.USAGE, str(field), float(amount))
        else:
            pipe.hincrby(keys.USAGE, str(field), int(amount))
    pipe.execute()


def pause_ttls(client: redis.Redis, pause_keys: Sequence[str]) -> list[int]:
    """PTTL of each provider pause key (the limiter's slot)."""
    if not pause_keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in pause_keys:
        pipe.pttl(key)
    return [int(ttl) for ttl in pipe.execute()]


def renew_each(
    client: redis.Redis, leases: Sequence[tuple[str, str]], ttl_ms: int, deadline_ms: int
) -> list[bool]:
    """Each lease renewed if still its owner's (one script per slot), then indexed at once.

    The scripts go in one pipeline, which the cluster client sends as one batch per node:
    a worker's heartbeat is a round trip per node, not per lease (a hundred leases renewed
    one by one on a loaded machine took long enough for some to lapse).
    """
    try:
        renewed = _renew_batch(client, leases, ttl_ms)
    except NoScriptError:  # a node restarted or was flushed: load it everywhere, once more
        client.script_load(RENEW_SLOT)
        renewed = _renew_batch(client, leases, ttl_ms)
    held = {trace_id: deadline_ms for (trace_id, _), ok in zip(leases, renewed, strict=True) if ok}
    if held:
        client.zadd(keys.RUNNING, held)
    return renewed
