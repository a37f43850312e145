"""The Lua scripts of `RedisStore`: each is one atomic round trip on the keys in `fleet.keys`.

Event stream writes (XADD + EXPIRE) ride along in the script of the write they describe, so
a write and its event cost one round trip and land together.
"""

from __future__ import annotations

# KEYS: trace, stats, traces index[, parent's children]
# ARGV: trace id, created_at_ms, ttl_s, n, n trace field/value items, stats field/value items
CREATE_TRACE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], unpack(ARGV, 5, 4 + n))
redis.call('HSET', KEYS[2], unpack(ARGV, 5 + n))
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
if KEYS[4] then redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1]) end
for i, key in ipairs(KEYS) do
  if i ~= 3 then redis.call('EXPIRE', key, ARGV[3]) end
end
return 1
"""

# KEYS: trace, stats, messages[, events]
# ARGV: ttl_s, events maxlen, event JSON ('' without KEYS[4]), field/value items
UPDATE_TRACE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[1]) end
if KEYS[4] then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[3])
  redis.call('EXPIRE', KEYS[4], ARGV[1])
end
return 1
"""

# KEYS: trace, stats, messages[, usage]. ARGV: ttl_s, message JSON without sequence and
# parent_sequence[, model, prompt_tokens, completion_tokens, cost_usd: a model turn's usage].
# The two fields are spliced into the caller's JSON text: cjson would turn [] into {}.
_MESSAGE_BODY = """
local seq = redis.call('HINCRBY', KEYS[1], 'last_sequence', 1)
local parent = redis.call('HGET', KEYS[1], 'head_sequence') or 'null'
local body = '{"sequence":' .. seq .. ',"parent_sequence":' .. parent .. ','
redis.call('HSET', KEYS[3], seq, body .. string.sub(ARGV[2], 2))
redis.call('HSET', KEYS[1], 'head_sequence', seq)
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[1]) end
"""

APPEND_MESSAGE = (
    "if redis.call('EXISTS', KEYS[1]) == 0 then return false end"
    + _MESSAGE_BODY
    + """
if KEYS[4] then
  redis.call('HINCRBY', KEYS[4], 'prompt_tokens:' .. ARGV[3], ARGV[4])
  redis.call('HINCRBY', KEYS[4], 'completion_tokens:' .. ARGV[3], ARGV[5])
  redis.call('HINCRBYFLOAT', KEYS[4], 'cost_usd:' .. ARGV[3], ARGV[6])
end
return {seq, parent}
"""
)

# A tool call's collected result, at most once: the mark and the message in one step, so a
# collector killed halfway leaves neither. KEYS: trace, stats, messages, collected mark.
# ARGV: ttl_s, message JSON without sequence and parent_sequence. Returns 0 if collected.
APPEND_ONCE = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if not redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[1]) then return 0 end
"""
    + _MESSAGE_BODY
    + "return {seq, parent}\n"
)

# APPEND_MESSAGE plus the message's event, and for a model turn its stats and iteration.
# KEYS: trace, stats, messages, events[, usage]
# ARGV: ttl_s, events maxlen, message JSON without sequence and parent_sequence, event JSON
# before and after its sequence, iteration ('' for no model turn), updated_at_ms,
# prompt_tokens, completion_tokens, cost_usd[, model: with KEYS[5]]
RECORD_TURN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local seq = redis.call('HINCRBY', KEYS[1], 'last_sequence', 1)
local parent = redis.call('HGET', KEYS[1], 'head_sequence') or 'null'
local body = '{"sequence":' .. seq .. ',"parent_sequence":' .. parent .. ','
redis.call('HSET', KEYS[3], seq, body .. string.sub(ARGV[3], 2))
redis.call('HSET', KEYS[1], 'head_sequence', seq)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[4] .. seq .. ARGV[5])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'iteration', ARGV[6], 'updated_at_ms', ARGV[7])
  redis.call('HINCRBY', KEYS[2], 'messages', 1)
  redis.call('HINCRBY', KEYS[2], 'prompt_tokens', ARGV[8])
  redis.call('HINCRBY', KEYS[2], 'completion_tokens', ARGV[9])
  redis.call('HINCRBYFLOAT', KEYS[2], 'cost_usd', ARGV[10])
end
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[1]) end
if KEYS[5] then
  redis.call('HINCRBY', KEYS[5], 'prompt_tokens:' .. ARGV[11], ARGV[8])
  redis.call('HINCRBY', KEYS[5], 'completion_tokens:' .. ARGV[11], ARGV[9])
  redis.call('HINCRBYFLOAT', KEYS[5], 'cost_usd:' .. ARGV[11], ARGV[10])
end
return {seq, parent}
"""

# KEYS: collaborators, collaborator order[, events]
# ARGV: ttl_s, child trace id, Collaborator JSON[, events maxlen, event JSON: with KEYS[3]]
PUT_COLLABORATOR = """
if redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
end
if KEYS[3] then redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'e', ARGV[5]) end
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ARGV[1]) end
"""

# KEYS: lease, running index. ARGV: owner, ttl_ms, deadline_ms, trace id
ACQUIRE_LEASE = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
"""

# KEYS: lease, running index. ARGV: owner, ttl_ms, deadline_ms, trace id
RENEW_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
"""

# KEYS: lease, running index. ARGV: owner, trace id
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
"""

# KEYS: running index, then one lease per held trace. ARGV: ttl_ms, deadline_ms, then an
# owner and a trace id per lease. Returns 1 per lease still ours (renewed), else 0.
RENEW_LEASES = """
local renewed = {}
for i = 2, #KEYS do
  local owner, trace = ARGV[2 * i - 1], ARGV[2 * i]
  if redis.call('GET', KEYS[i]) == owner then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    redis.call('ZADD', KEYS[1], ARGV[2], trace)
    renewed[i - 1] = 1
  else
    renewed[i - 1] = 0
  end
end
return renewed
"""

# KEYS: stats. ARGV: ttl_s, then name, kind (i: HINCRBY, f: HINCRBYFLOAT), delta triples.
ADD_STATS = """
for i = 2, #ARGV, 3 do
  if ARGV[i + 1] == 'f' then
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 2])
  else
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 2])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""

# KEYS: events. ARGV: ttl_s, maxlen, event JSON. Returns the entry id.
EMIT = """
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return id
"""

# KEYS: a sorted set scored by due time (ms). ARGV: now_ms, next due ms, limit.
# Members due by now are pushed back to the next due time and returned: each to one caller,
# and one that caller fails to finish comes due again.
CLAIM_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], member) end
return due
"""

# Prepended to a write script for a runner's fenced store: KEYS[1] is the runner's lease and
# ARGV[1] its owner token; both are taken off before the script proper runs. The lease check
# and the write are one atomic step, so a runner whose lease lapsed (a frozen VM, a long GC)
# cannot write into a trace another runner took over, not even in the instant after a check.
FENCE = """
local lease_key = table.remove(KEYS, 1)
local lease_owner = table.remove(ARGV, 1)
if redis.call('GET', lease_key) ~= lease_owner then
  return redis.error_reply('FENCED the lease is not held by this runner')
end
"""

FENCED_PREFIX = "FENCED"
"""The start of the error a fenced script returns when the lease is not the caller's."""


def fenced(script: str) -> str:
    """The script behind the lease check of `FENCE`."""
    return FENCE + script


# A `TraceWrite` (fleet.writes) in one step: its ops in order, and the stop flag read at the
# end, so the runner's next turn needs no read of its own. TTLs are refreshed (once per key)
# by a write that sets fields (a status change, a finish) or creates the messages hash: a
# trace's keys then live TRACE_TTL_S past its last status change, as with a write per call
# (a run is bounded by the task time limit; a wait writes nothing either way).
# KEYS: trace, stats, messages, events, usage, lease, running index, stop[, parent's
# collaborators, parent's collaborator order: with a `collab` op]
# ARGV: ttl_s, events maxlen, ops: a JSON array of arrays of strings, one per op:
#   {'set', {field, JSON value, ...}, event JSON or ''}
#   {'add', message JSON without sequence and parent_sequence, event JSON before and after
#    its sequence ('' for no event), iteration ('' for no model turn), updated_at_ms,
#    prompt_tokens, completion_tokens, cost_usd, model ('' for no usage)}
#   {'stats', name, 'i' or 'f', delta, ...}
#   {'collab', child trace id, Collaborator JSON, event JSON or ''}
#   {'emit', event JSON}
#   {'release', owner, trace id}
# Returns {{sequence, parent JSON} per appended message, stop flag}, or nil for no trace.
APPLY = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local stored, events, collabs, refresh = {}, false, false, false
local function emit(e)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'e', e)
  events = true
end
local function incr(key, field, delta, float)
  if delta == '0' then return end
  redis.call(float and 'HINCRBYFLOAT' or 'HINCRBY', key, field, delta)
end
local function add(op)
  local seq = redis.call('HINCRBY', KEYS[1], 'last_sequence', 1)
  local parent = redis.call('HGET', KEYS[1], 'head_sequence') or 'null'
  local head = '{"sequence":' .. seq .. ',"parent_sequence":' .. parent .. ','
  redis.call('HSET', KEYS[3], seq, head .. string.sub(op[2], 2))
  if seq == 1 then refresh = true end
  if op[5] == '' then
    redis.call('HSET', KEYS[1], 'head_sequence', seq)
  else
    redis.call('HSET', KEYS[1], 'head_sequence', seq, 'iteration', op[5], 'updated_at_ms', op[6])
    redis.call('HINCRBY', KEYS[2], 'messages', 1)
    incr(KEYS[2], 'prompt_tokens', op[7])
    incr(KEYS[2], 'completion_tokens', op[8])
    incr(KEYS[2], 'cost_usd', op[9], true)
  end
  if op[10] ~= '' then
    redis.call('HINCRBY', KEYS[5], 'prompt_tokens:' .. op[10], op[7])
    redis.call('HINCRBY', KEYS[5], 'completion_tokens:' .. op[10], op[8])
    redis.call('HINCRBYFLOAT', KEYS[5], 'cost_usd:' .. op[10], op[9])
  end
  if op[3] ~= '' then emit(op[3] .. seq .. op[4]) end
  stored[#stored + 1] = {seq, parent}
end
for _, op in ipairs(cjson.decode(ARGV[3])) do
  local kind = op[1]
  if kind == 'add' then
    add(op)
  elseif kind == 'set' then
    redis.call('HSET', KEYS[1], unpack(op[2]))
    refresh = true
    if op[3] ~= '' then emit(op[3]) end
  elseif kind == 'stats' then
    for i = 2, #op, 3 do incr(KEYS[2], op[i], op[i + 2], op[i + 1] == 'f') end
  elseif kind == 'collab' then
    if redis.call('HSET', KEYS[9], op[2], op[3]) == 1 then redis.call('RPUSH', KEYS[10], op[2]) end
    collabs = true
    if op[4] ~= '' then emit(op[4]) end
  elseif kind == 'emit' then
    emit(op[2])
  elseif kind == 'release' and redis.call('GET', KEYS[6]) == op[2] then
    redis.call('DEL', KEYS[6])
    redis.call('ZREM', KEYS[7], op[3])
  end
end
if refresh then
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[1]) end
  if events then redis.call('EXPIRE', KEYS[4], ARGV[1]) end
end
if collabs then
  redis.call('EXPIRE', KEYS[9], ARGV[1])
  redis.call('EXPIRE', KEYS[10], ARGV[1])
end
return {stored, redis.call('EXISTS', KEYS[8])}
"""

# The lease, then the trace as `snapshot` reads it, in one step: a runner's first round trip.
# KEYS: lease, running index, trace, stats, messages, stop. ARGV: owner, ttl_ms, deadline_ms,
# trace id. Returns -1 for no trace (nothing taken), 0 when another runner holds the lease,
# else {trace hash, stats hash, messages hash, stop flag} with each hash as a flat list.
BEGIN_RUN = """
if redis.call('EXISTS', KEYS[3]) == 0 then return -1 end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return {redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]),
        redis.call('HGETALL', KEYS[5]), redis.call('EXISTS', KEYS[6])}
"""
