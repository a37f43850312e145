"""A runner's first round trip (`RedisStore.begin_run`): the lease and the trace in one step.

`BEGIN_RUN` takes the lease, starts the trace and reads what its first model call needs
(the trace, the pauses, the inbox's newest entry, whether the tree has a budget, the
experiences' version); `begin_call` builds its KEYS and ARGV.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from fleet.models import SCHEMA_VERSION, now_ms
from fleet.storage import keys
from fleet.storage.store import STARTABLE, StartRun

_STARTABLE = " or ".join(f"status == '{json.dumps(status)}'" for status in STARTABLE)
"""`store.STARTABLE` as a Lua condition on the stored (JSON) status."""

# The lease, then the trace as `snapshot` reads it, in one step: a runner's first round
# trip. A trace of the given root in a `STARTABLE` status is set running with its event first.
# KEYS: trace, lease, running index, the guessed root's events, the trace's inbox, the
# guessed root's budget, the experiences' version counter and hash, then pause keys to read
# ARGV: owner, ttl_ms, deadline_ms, trace id, events maxlen, root id as JSON ('' for no
# start), the running event JSON, updated_at_ms, '1' when the caller indexes the lease (a
# cluster: KEYS[3] is a stand-in), the newest record schema the caller reads, '=' and the
# experiences' version the caller's process holds them at ('' for none held), then the presets
# (JSON) whose trace with no message yet reads the experiences' keys
# Returns -1 for no trace (nothing taken), -2 for a trace of a newer schema (nothing taken:
# a worker of that release runs it), 0 when another runner holds the lease, else
# {the trace hash (its messages included) as a flat list, {PTTL per pause key}, the
# inbox's newest entry id ('' for none), 1 if the budget exists else 0 (as a root's record
# says, else looked for), {the experiences' version or false, their count: -1 when the
# version is the one held} or 0 when not read}: the first model call needs no read of its
# own.
BEGIN_RUN = (
    """
local trace = redis.call('HGETALL', KEYS[1])
if #trace == 0 then return -1 end
local at = {}
for i = 1, #trace, 2 do at[trace[i]] = i + 1 end
local schema = at['schema_version'] and trace[at['schema_version']]
if schema and tonumber(schema) > tonumber(ARGV[10]) then return -2 end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
end
if ARGV[9] ~= '1' then redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4]) end
local status = trace[at['status']]
if ARGV[6] ~= '' and trace[at['root_trace_id']] == ARGV[6] and ("""
    + _STARTABLE
    + """) then
  redis.call('HSET', KEYS[1], 'status', '"running"', 'updated_at_ms', ARGV[8])
  trace[at['status']] = '"running"'
  if at['updated_at_ms'] then trace[at['updated_at_ms']] = ARGV[8] end
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'e', ARGV[7])
end
local pauses = {}
for k = 9, #KEYS do pauses[#pauses + 1] = redis.call('PTTL', KEYS[k]) end
local newest = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)
local learnt, last = 0, at['last_sequence'] and trace[at['last_sequence']]
if #ARGV > 11 and (not last or last == '0') then
  for k = 12, #ARGV do
    if trace[at['preset']] == ARGV[k] then
      local version = redis.call('GET', KEYS[7])
      if ARGV[11] == '=' .. (version or '') then learnt = {version, -1}
      else learnt = {version, redis.call('HLEN', KEYS[8])} end
      break
    end
  end
end
local budgeted = at['r:budgeted'] and trace[at['r:budgeted']]
if budgeted == 'true' then budgeted = 1
elseif budgeted == 'false' then budgeted = 0
else budgeted = redis.call('EXISTS', KEYS[6]) end
return {trace, pauses, newest[1] and newest[1][1] or '', budgeted, learnt}
"""
)


def begin_call(
    trace_id: str,
    owner: str,
    ttl_ms: int,
    start: StartRun | None,
    pauses: Sequence[str],
    *,
    cluster: bool,
) -> tuple[list[str], list[str | int], int]:
    """`BEGIN_RUN`'s KEYS and ARGV, and the lease's deadline (ms)."""
    root = start.root_trace_id if start else trace_id
    lease, deadline_ms = keys.lease(trace_id), now_ms() + ttl_ms
    running = lease if cluster else keys.RUNNING  # a stand-in in its slot
    tree = [keys.trace(trace_id), lease, running, keys.events(root), keys.inbox(trace_id)]
    tree += [keys.budget(root), keys.EXPERIENCES_VERSION, keys.EXPERIENCES]
    if cluster:  # fleet-wide keys are in other slots: stand-ins, nothing read there
        tree[-2:] = [lease, lease]
    shows = start.experiences if start and not cluster else frozenset()
    script_keys = tree + ([] if cluster else list(pauses))
    args: list[str | int] = [owner, ttl_ms, deadline_ms, trace_id, keys.EVENTS_MAXLEN]
    args += [json.dumps(root), start.event.model_dump_json()] if start else ["", ""]
    args += [now_ms(), "1" if cluster else "", SCHEMA_VERSION]
    held = start.experiences_held if start else None
    args.append("" if held is None else "=" + held)
    args += [json.dumps(p) for p in sorted(shows)]
    return script_keys, args, deadline_ms
