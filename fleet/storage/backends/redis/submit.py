"""A new root in one round trip: the serving check, the root, its indexes and its first event.

`Fleet.submit` used to make five dependent round trips before its task was queued (the
queue's live consumers, their presences, the open-trees index, the create script, the
queued event, then the roots index). On a single Redis `QUEUE_ROOT` does them all in one
script. Its serving check is a fast path: a workspace that is, as a string, one of a live
worker's announced roots or below one is accepted there (a resolved path under a root's
text passes `trust.check_workspace_root` too); anything else comes back with the
presences, unwritten, for the exact check in Python (`watchdog.check_presences`), which
either refuses it or has the script run again without the check.

On a cluster (the indexes and the presences are in other slots than the tree) and in a
fenced view (a runner's writes check its lease) the steps go one by one
(`fleet.storage.root_queue.queue_in_steps`).

The task's own message is kombu's to build and route. When the broker is this Redis, the
client hands it over as kombu's own commands (`fleet.storage.root_message`) and the script
puts it after the root's writes, only when it wrote them: a worker never takes a task whose
trace is not there yet. Else (another server, RabbitMQ) the client sends it after.
"""

from __future__ import annotations

from typing import Any

import redis

from fleet.errors import TraceExists
from fleet.models import Event, Trace, WorkerPresence, now_ms
from fleet.storage import keys
from fleet.storage.backends.redis import writes as redis_writes
from fleet.storage.backends.redis.connect import Lua
from fleet.storage.root_message import Command
from fleet.storage.store import Serving
from fleet.storage.watchdog import check_presences

# KEYS: the queue's consumers (any key without a check), open trees, traces index, the
# trace, its tree's events, roots index ('' ARGV[10]: not listed), then the task message's
# queue keys (one per `lpush`, in order)
# ARGV: now_ms, the worker presence key prefix, the workspace ('' for no check), ttl_s,
# trace id, created_at_ms, events maxlen, the queued event JSON, open-trees score, '1' to
# list the root, n, then n message commands of 3 (`lpush`, key, payload: to the next queue
# key; `publish`, channel, payload), then the trace's field/value items.
# Returns {1} when created, {-1} when the id exists (nothing written), {0, presence JSON,
# ...} when no announced root of a live worker covers the workspace's text (nothing written).
QUEUE_ROOT = """
local function under(ws, root)
  if ws == root then return true end
  if string.sub(root, -1) ~= '/' then root = root .. '/' end
  return string.sub(ws, 1, #root) == root
end
if ARGV[3] ~= '' then
  local nodes = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf')
  if #nodes > 0 then
    local names = {}
    for i, node in ipairs(nodes) do names[i] = ARGV[2] .. node end
    local announced, covered = {}, false
    for _, raw in ipairs(redis.call('MGET', unpack(names))) do
      if raw then
        local roots = cjson.decode(raw)['roots']
        if type(roots) == 'table' and #roots > 0 then
          announced[#announced + 1] = raw
          for _, root in ipairs(roots) do
            if type(root) == 'string' and under(ARGV[3], root) then covered = true end
          end
        end
      end
    end
    if #announced > 0 and not covered then return {0, unpack(announced)} end
  end
end
if redis.call('EXISTS', KEYS[4]) == 1 then return {-1} end
local n = tonumber(ARGV[11])
redis.call('ZADD', KEYS[2], ARGV[9], ARGV[5])
redis.call('HSET', KEYS[4], unpack(ARGV, 12 + 3 * n, #ARGV))
redis.call('EXPIRE', KEYS[4], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[5])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[7], '*', 'e', ARGV[8])
redis.call('EXPIRE', KEYS[5], ARGV[4])
if ARGV[10] == '1' then redis.call('ZADD', KEYS[6], ARGV[6], ARGV[5]) end
local queue = 6
for i = 12, 11 + 3 * n, 3 do
  if ARGV[i] == 'lpush' then
    queue = queue + 1
    redis.call('LPUSH', KEYS[queue], ARGV[i + 2])
  else
    redis.call('PUBLISH', ARGV[i + 1], ARGV[i + 2])
  end
end
return {1}
"""

_queue_root = Lua(QUEUE_ROOT)


def queue_root(
    client: redis.Redis, trace: Trace, event: Event, serving: Serving | None, listed: bool
) -> None:
    """`TraceStore.queue_root` on a single Redis: one script (twice for an exact check).

    Raises:
        ConfigError: no live worker of `serving.queue` accepts its workspace.
        TraceExists: the id is taken.
    """
    _, create_args = redis_writes.create_call([trace])
    items = create_args[6:]  # the trace's field/value items (`CREATE_TRACES`'s layout)
    root = trace.trace_id
    script_keys = [
        keys.consumers(serving.queue) if serving else keys.OPEN_TREES,
        keys.OPEN_TREES,
        keys.TRACES,
        keys.trace(root),
        keys.events(trace.root_trace_id),
        keys.ROOTS,
    ]
    message = _message(serving, trace)
    script_keys += [key for name, key, _ in message if name == "lpush"]
    at = now_ms()
    args: list[Any] = [at, keys.worker(""), str(serving.workspace) if serving else ""]
    args += [keys.TRACE_TTL_S, root, trace.created_at_ms, keys.EVENTS_MAXLEN]
    args += [event.model_dump_json(), at, "1" if listed else "", len(message)]
    args += [part for command in message for part in command]
    args += items
    reply = _queue_root(client, script_keys, args)
    if reply[0] == 0 and serving is not None:
        presences = [WorkerPresence.model_validate_json(raw) for raw in reply[1:]]
        check_presences(presences, serving.queue, serving.workspace)  # raises, or it is served
        args[2] = ""
        reply = _queue_root(client, script_keys, args)
    if reply[0] == -1:
        raise TraceExists(f"trace {root!r} already exists")
    if message and serving is not None and serving.message is not None:
        serving.message.sent = True


def _message(serving: Serving | None, trace: Trace) -> tuple[Command, ...]:
    """The root's task message as the script puts it (`fleet.storage.root_message`)."""
    if serving is None or serving.message is None:
        return ()
    commands = serving.message.commands(trace) or ()
    if any(name not in ("lpush", "publish") for name, _, _ in commands):
        return ()  # nothing the script knows: the caller sends it
    return commands
