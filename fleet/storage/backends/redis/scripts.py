"""The Lua scripts of `RedisStore`: each one atomic round trip on the keys of `fleet.storage.keys`.

A trace's writes go through `APPLY` (a `fleet.storage.writes.TraceWrite`: fields, messages, stats,
events, the parent's collaborator entry, the lease's release, in order), so a write and
its events cost one round trip and land together. What a write costs Redis is counted in
commands: the trace hash is read once (`HMGET`: existence, numbering, stats, stop flag)
and written once (`HSET`: its fields and the write's messages, which are fields of it),
and TTLs are set where a key is created and refreshed when a trace changes status (not
to running; nor within `FRESH_SHARE` of the TTL after its creation, which set them).
"""

from __future__ import annotations

import re

from fleet.storage.backends.redis.entries import KEEP

# `redis.call(command, key, items...)` in chunks: Lua's unpack stops at ~8000 values (an
# explore may be wider). Returns the first chunk's reply.
BULK = """
local function bulk(command, key, items)
  local first
  for j = 1, #items, 4000 do
    local reply = redis.call(command, key, unpack(items, j, math.min(j + 3999, #items)))
    first = first or reply
  end
  return first
end
"""

# KEYS: traces index, then per trace: its hash, its parent's children (its hash if none)[, outbox].
# ARGV: ttl_s, '1' to index the new traces here (else the caller does: a cluster, where the
# index is in another slot), then per trace: trace id, created_at_ms, '1' with a parent else
# '', n, n field/value items[, a spawn's outbox entry, its due ms]. Returns 1 per trace
# created, 0 per id that existed.
CREATE_TRACES = (
    BULK
    + """
local created, indexed, children = {}, {}, {}
local i = 3
for t = 2, #KEYS - 1, 2 do
  local id, at, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 3])
  if redis.call('EXISTS', KEYS[t]) == 1 then
    created[#created + 1] = 0
  else
    redis.call('HSET', KEYS[t], unpack(ARGV, i + 4, i + 3 + n))
    redis.call('EXPIRE', KEYS[t], ARGV[1])
    indexed[#indexed + 1] = at
    indexed[#indexed + 1] = id
    if ARGV[i + 2] == '1' then
      local kids = children[KEYS[t + 1]] or {}
      kids[#kids + 1] = at
      kids[#kids + 1] = id
      children[KEYS[t + 1]] = kids
    end
    created[#created + 1] = 1
  end
  i = i + 4 + n
end
if #indexed > 0 and ARGV[2] == '1' then bulk('ZADD', KEYS[1], indexed) end
for key, kids in pairs(children) do
  bulk('ZADD', key, kids)
  redis.call('EXPIRE', key, ARGV[1])
end
if #KEYS % 2 == 0 then redis.call('ZADD', KEYS[#KEYS], ARGV[i + 1], ARGV[i]) end
return created
"""
)

FRESH_SHARE = 100
"""A trace's status change within 1/FRESH_SHARE of the TTL after its creation (1.7 h of 7
days) leaves its TTL as its creation set it, not refreshed: `APPLY`'s `set`."""

# A `TraceWrite` in one step: its ops in order, then the stop flag (as of the write) and the
# PTTLs of the pause keys it reads (for the model call after it).
# KEYS: trace, events, usage, lease, running index[, the parent's collaborators, collaborator
# order: with a `collab` op][, an extension's keys: with an `ext` op][, the inbox: with
# ARGV[6]], then the np pause keys
# ARGV: ttl_s, events maxlen, '1' when the trace is its tree's root, np, '1' to split (a
# cluster: KEYS[3] and KEYS[5] are stand-ins in the trace's slot, the usage to count and
# the release's index removal are returned for the caller to do), '1' to read the inbox's
# newest entry, '1' to refuse the write whole (a `STOPPED` error, nothing written) when
# the stop flag is raised, '1' when the trace was just thawed (`compact.thaw`), then the
# ops, each as kind, n, then its n arguments:
#   set     event JSON or '', then field, JSON value, ... (a status other than running
#           refreshes the trace's TTL, messages included; the root's, the tree's events;
#           not when the trace was created less than `FRESH_SHARE` of the TTL before this
#           write's `updated_at_ms` and not thawed since: its keys got their whole TTL then)
#   add     message JSON without sequence and parent_sequence; event JSON before and after
#           its sequence ('' for no event); iteration ('' for no model turn: else its usage
#           goes to the stats); updated_at_ms; prompt_tokens; completion_tokens; cost_usd;
#           model ('' for no fleet-wide usage: else it is added to the trace's `uncounted`);
#           cached_tokens; cache_write_tokens (to the stats with the rest of the usage)
#   stats   name, delta, ...
#   collab  child trace id, Collaborator JSON, event JSON or '', '1' when the parent writes
#           its own entries (their TTLs are refreshed; a child's entry only sets them new)
#   emit    event JSON
#   release owner, trace id, '1' when the fence already checked that owner this step
#   ext     index of the extension's first key, its number of keys, then its arguments:
#           the registered function of the script's extension (`apply_source`) is called
#           with those keys, then those arguments
# Messages are fields `m:{sequence}` of the trace hash, numbered here from its
# `last_sequence` and hung under its head; the two fields are spliced into the caller's
# JSON text (cjson would turn [] into {}). Stats are the `stats` field (TraceStats JSON),
# added to here. The fleet-wide usage of model turns (`fleet metrics`) waits in the trace's
# `uncounted` field ({model: [prompt, completion, cost, cached]}) and goes to KEYS[3] when the
# trace changes status other than to running (a run's last write: finish, waiting, queued
# again), the field deleted in the same step: each call is counted once, and the calls of
# a run that died are counted by the next write that ends a run of the trace.
# Returns {{sequence, parent JSON} per appended message, stop flag, {PTTL per pause key},
# what an `ext` op's function returned (else nil), {usage field,
# amount, ...} to count (split only), 1 if a release took the lease (split only), the
# inbox's newest entry id ('' for none; nil when not asked)}, or nil for no trace.
APPLY_BODY = (
    """
local ttl, maxlen, root, np = ARGV[1], ARGV[2], ARGV[3] == '1', tonumber(ARGV[4])
local split, counted, released = ARGV[5] == '1', {}, 0
local function incr(command, field, amount)
  if split then
    counted[#counted + 1] = field
    counted[#counted + 1] = amount
  else
    redis.call(command, KEYS[3], field, amount)
  end
end
local state = redis.call('HMGET', KEYS[1], 'last_sequence', 'head_sequence', 'stats', 'stop',
  'uncounted', 'created_at_ms')
if not state[1] then return false end
if ARGV[7] == '1' and state[4] then return redis.error_reply('STOPPED a stop was requested') end
local last, head = tonumber(state[1]), state[2]
local fields, bodies, stored, kids, children = {}, {}, {}, {}, {}
local stats, uncounted, refresh, moved, entries = nil, nil, false, false, false
local extended = false
local function emit(e) redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'e', e) end
local function stat(name, delta)
  if tonumber(delta) == 0 then return end
  stats = stats or cjson.decode(state[3] or '{}')
  stats[name] = (stats[name] or 0) + tonumber(delta)
end
local function usage(model, prompt, completion, cost, cached)
  if model == '' then return end
  uncounted = uncounted or cjson.decode(state[5] or '{}')
  local u = uncounted[model] or {0, 0, 0, 0}
  u[1], u[2], u[3] = u[1] + tonumber(prompt), u[2] + tonumber(completion), u[3] + tonumber(cost)
  u[4] = (u[4] or 0) + tonumber(cached)  -- an entry left by an older writer has three
  uncounted[model] = u
end
-- The run's usage, fleet-wide, once: what its turns (and a dead run's) left uncounted.
local function count_usage()
  if not (uncounted or state[5]) then return end
  for model, u in pairs(uncounted or cjson.decode(state[5])) do
    if u[1] ~= 0 then
      incr('HINCRBY', 'prompt_tokens:' .. model, string.format('%d', u[1]))
    end
    if u[2] ~= 0 then
      incr('HINCRBY', 'completion_tokens:' .. model, string.format('%d', u[2]))
    end
    if u[3] ~= 0 then
      incr('HINCRBYFLOAT', 'cost_usd:' .. model, string.format('%.14g', u[3]))
    end
    if (u[4] or 0) ~= 0 then
      incr('HINCRBY', 'cached_tokens:' .. model, string.format('%d', u[4]))
    end
  end
  if state[5] then redis.call('HDEL', KEYS[1], 'uncounted') end
  uncounted = nil
end
local function add(a)
  last = last + 1
  bodies[#bodies + 1] = 'm:' .. last
  bodies[#bodies + 1] = '{"sequence":' .. last .. ',"parent_sequence":' .. head .. ','
    .. string.sub(ARGV[a + 1], 2)
  stored[#stored + 1] = {last, head}
  head, moved = tostring(last), true
  if ARGV[a + 4] ~= '' then
    fields['iteration'], fields['updated_at_ms'] = ARGV[a + 4], ARGV[a + 5]
    stat('messages', 1)
    stat('prompt_tokens', ARGV[a + 6])
    stat('completion_tokens', ARGV[a + 7])
    stat('cost_usd', ARGV[a + 8])
    stat('cached_tokens', ARGV[a + 10])
    stat('cache_write_tokens', ARGV[a + 11])
  end
  usage(ARGV[a + 9], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 10])
  if ARGV[a + 2] ~= '' then emit(ARGV[a + 2] .. last .. ARGV[a + 3]) end
end
local function set(a, n)
  for j = a + 2, a + n, 2 do
    local name, value = ARGV[j], ARGV[j + 1]
    fields[name] = value
    if name == 'head_sequence' then head, moved = value, false end
    if name == 'last_sequence' then last = tonumber(value) end
    if name == 'status' and value ~= '"running"' then refresh = true end
  end
  if ARGV[a + 1] ~= '' then emit(ARGV[a + 1]) end
end
local function collab(a)
  if ARGV[a + 4] == '1' then entries = true end
  if not children[ARGV[a + 1]] then kids[#kids + 1] = ARGV[a + 1] end
  children[ARGV[a + 1]] = ARGV[a + 2]
  if ARGV[a + 3] ~= '' then emit(ARGV[a + 3]) end
end
-- The entries in one HSET; the new ones listed in the order list once, in first-added order.
local function put_entries()
  local listed = {}
  if #kids == 1 then
    local old = redis.call('HGET', KEYS[6], kids[1])
    redis.call('HSET', KEYS[6], kids[1], kept(children[kids[1]], old))
    if not old then listed = kids end
  else
    local items = {}
    for j = 1, #kids, 4000 do
      local known = redis.call('HMGET', KEYS[6], unpack(kids, j, math.min(j + 3999, #kids)))
      for k = 1, #known do
        local id = kids[j + k - 1]
        if known[k] then children[id] = kept(children[id], known[k])
        else listed[#listed + 1] = id end
      end
    end
    for _, id in ipairs(kids) do
      items[#items + 1] = id
      items[#items + 1] = children[id]
    end
    bulk('HSET', KEYS[6], items)
  end
  if #listed > 0 and bulk('RPUSH', KEYS[7], listed) == math.min(#listed, 4000) then
    entries = true
  end
end
local function release(a)
  if ARGV[a + 3] == '1' or redis.call('GET', KEYS[4]) == ARGV[a + 1] then
    redis.call('DEL', KEYS[4])
    if split then released = 1 else redis.call('ZREM', KEYS[5], ARGV[a + 2]) end
  end
end
local first = last
local i = 9
while i <= #ARGV do
  local kind, n = ARGV[i], tonumber(ARGV[i + 1])
  local a = i + 1
  if kind == 'add' then add(a)
  elseif kind == 'set' then set(a, n)
  elseif kind == 'stats' then
    for j = a + 1, a + n, 2 do stat(ARGV[j], ARGV[j + 1]) end
  elseif kind == 'collab' then collab(a)
  elseif kind == 'emit' then emit(ARGV[a + 1])
  elseif kind == 'release' then release(a)
  elseif kind == 'ext' then
    local k, values = tonumber(ARGV[a + 1]), {}
    for j = k, k + tonumber(ARGV[a + 2]) - 1 do values[#values + 1] = KEYS[j] end
    for j = a + 3, a + n do values[#values + 1] = ARGV[j] end
    extended = extension(unpack(values))
  end
  i = a + n + 1
end
if refresh then count_usage() end
if moved then fields['head_sequence'] = head end
if last ~= first then fields['last_sequence'] = last end
if stats then fields['stats'] = cjson.encode(stats) end
if uncounted then fields['uncounted'] = cjson.encode(uncounted) end
local items = bodies
for name, value in pairs(fields) do
  items[#items + 1] = name
  items[#items + 1] = value
end
if #items > 0 then bulk('HSET', KEYS[1], items) end
if #kids > 0 then put_entries() end
-- A trace created moments ago (not thawed since) has its keys' TTL from its creation.
local made, changed = tonumber(state[6] or ''), tonumber(fields['updated_at_ms'] or '')
if refresh and ARGV[8] ~= '1' and made and changed
  and changed - made < tonumber(ttl) * 1000 / """
    + str(FRESH_SHARE)
    + """ then
  refresh = false
end
if refresh then
  redis.call('EXPIRE', KEYS[1], ttl)
  if root then redis.call('EXPIRE', KEYS[2], ttl) end
end
if entries then
  redis.call('EXPIRE', KEYS[6], ttl)
  redis.call('EXPIRE', KEYS[7], ttl)
end
local pauses = {}
for k = #KEYS - np + 1, #KEYS do pauses[#pauses + 1] = redis.call('PTTL', KEYS[k]) end
local newest = false
if ARGV[6] == '1' then
  local found = redis.call('XREVRANGE', KEYS[#KEYS - np], '+', '-', 'COUNT', 1)
  newest = found[1] and found[1][1] or ''
end
return {stored, state[4] and 1 or 0, pauses, extended, counted, released, newest}
"""
)

WRITE_EXTENSIONS: dict[str, tuple[str, str]] = {}
"""Registered write extensions: name -> (Lua source defining the function, its name)."""

_LUA_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_write_extension(name: str, source: str, function: str) -> None:
    """Let a write run `function` (defined by the Lua `source`) as its extension `name`.

    A host's own step in the atomic write (`fleet.storage.writes.WriteExtension`): the
    function is called with the op's keys, then its arguments, and its return value comes
    back in `WriteExtension.reply`. Registering a name again with the same source is a no-op.
    """
    if not _LUA_NAME.fullmatch(function):
        raise ValueError(f"write extension {name!r}: {function!r} is not a Lua name")
    known = WRITE_EXTENSIONS.setdefault(name, (source, function))
    if known != (source, function):
        raise ValueError(f"write extension {name!r} is already registered otherwise")


def apply_source(extension: str | None = None) -> str:
    """`APPLY` with the registered `extension` (None: with none; an `ext` op then errors)."""
    if extension is None:
        return BULK + KEEP + "local extension = nil\n" + APPLY_BODY
    if extension not in WRITE_EXTENSIONS:
        raise ValueError(f"no write extension {extension!r} is registered")
    source, function = WRITE_EXTENSIONS[extension]
    return BULK + KEEP + source + f"local extension = {function}\n" + APPLY_BODY


APPLY = apply_source()
"""A write's script (`fleet.storage.writes.TraceWrite`), without an extension."""

# A tool call's collected result, at most once: the mark and the message in one step, so a
# collector killed halfway leaves neither. KEYS: trace, collected mark.
# ARGV: ttl_s, message JSON without sequence and parent_sequence. Returns 0 if collected.
APPEND_ONCE = """
local state = redis.call('HMGET', KEYS[1], 'last_sequence', 'head_sequence')
if not state[1] then return false end
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local seq, parent = tonumber(state[1]) + 1, state[2]
local body = '{"sequence":' .. seq .. ',"parent_sequence":' .. parent .. ','
redis.call('HSET', KEYS[1], 'm:' .. seq, body .. string.sub(ARGV[2], 2),
  'last_sequence', seq, 'head_sequence', seq)
return {seq, parent}
"""

# KEYS: trace. Returns 1 if the trace exists (its stop flag is now raised), else 0.
REQUEST_STOP = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'stop', '1')
return 1
"""

# KEYS: events. ARGV: ttl_s, maxlen, event JSON. Returns the entry id.
EMIT = """
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return id
"""
