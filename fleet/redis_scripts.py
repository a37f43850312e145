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

# -- provider limits (fleet.limits) ---------------------------------------------
# A scope is a provider+key or a model alias. Requests and tokens are paced by GCRA with no
# burst (each admission books the next free time: `rtat`/`ttat`), so bookings are handed
# out in arrival order and a trace that was handed back keeps its place (its ticket). The
# admissions themselves are also spaced from the last one (`rnext`/`tnext`): turns taken
# late never go out as a burst.
# Concurrency is a semaphore (sorted set with deadlines, so a dead worker's slot lapses)
# with a first-come-first-served line. Time is Redis's own clock: every worker agrees.

_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS: ticket, stats, then per scope: state, slots, line, seen, pause
# ARGV: holder, est tokens, max_wait_ms, slot_ttl_ms, ticket grace ms, line stale ms,
#       state ttl s, then per scope: name, requests/min, tokens/min, max concurrency (0: none)
# Returns {1, wait_ms, 'ok'}: admitted, go in wait_ms (<= max_wait_ms);
#         {0, retry_ms, reason}: not now (reason pause | concurrency | rate), ask again then.
LIMIT_ADMIT = (
    _NOW
    + """
local holder, est = ARGV[1], tonumber(ARGV[2])
local max_wait, slot_ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local grace, stale, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local n = (#KEYS - 2) / 5
local function key(i, k) return KEYS[2 + 5 * (i - 1) + k] end
local function arg(i, k) return ARGV[7 + 4 * (i - 1) + k] end
local function num(i, k) return tonumber(arg(i, k)) end
local function field(i, f) return tonumber(redis.call('HGET', key(i, 1), f)) or 0 end
local function count(what)
  for i = 1, n do redis.call('HINCRBY', KEYS[2], what .. ':' .. arg(i, 1), 1) end
end
local paused = 0
for i = 1, n do
  local left = redis.call('PTTL', key(i, 5))
  if left > paused then paused = left end
end
if paused > 0 then count('waited') return {0, paused, 'pause'} end
for i = 1, n do
  local maxc = num(i, 4)
  if maxc > 0 and not redis.call('ZSCORE', key(i, 2), holder) then
    redis.call('ZREMRANGEBYSCORE', key(i, 2), '-inf', now)
    for _, gone in ipairs(redis.call('ZRANGEBYSCORE', key(i, 4), '-inf', now - stale)) do
      redis.call('ZREM', key(i, 3), gone)
      redis.call('ZREM', key(i, 4), gone)
    end
    local free = maxc - redis.call('ZCARD', key(i, 2))
    local ahead = redis.call('ZRANK', key(i, 3), holder) or redis.call('ZCARD', key(i, 3))
    if ahead >= free then
      redis.call('ZADD', key(i, 3), 'NX', now, holder)
      redis.call('ZADD', key(i, 4), now, holder)
      for k = 2, 4 do redis.call('EXPIRE', key(i, k), ttl) end
      local mean = field(i, 'dur_ms')
      if mean <= 0 then mean = 1000 end
      count('waited')
      return {0, math.floor(mean * (ahead - free + 1) / maxc) + 1, 'concurrency'}
    end
  end
end
local at = tonumber(redis.call('HGET', KEYS[1], 'at'))
if at then
  for i = 1, n do
    local epoch = redis.call('HGET', key(i, 1), 'epoch') or '0'
    if redis.call('HGET', KEYS[1], 'e' .. i) ~= epoch then at = nil end
  end
end
if not at then
  at = now
  for i = 1, n do
    if num(i, 2) > 0 and field(i, 'rtat') > at then at = field(i, 'rtat') end
    if num(i, 3) > 0 and field(i, 'ttat') > at then at = field(i, 'ttat') end
  end
  for i = 1, n do
    if num(i, 2) > 0 then redis.call('HSET', key(i, 1), 'rtat', at + 60000 / num(i, 2)) end
    if num(i, 3) > 0 then redis.call('HSET', key(i, 1), 'ttat', at + est * 60000 / num(i, 3)) end
    redis.call('EXPIRE', key(i, 1), ttl)
  end
end
-- `at` is the booked turn; a late trace (its worker was busy) is still spaced from the
-- last admission, so late turns never bunch up into a burst.
local go = at
for i = 1, n do
  if num(i, 2) > 0 and field(i, 'rnext') > go then go = field(i, 'rnext') end
  if num(i, 3) > 0 and field(i, 'tnext') > go then go = field(i, 'tnext') end
end
local wait = go - now
if wait > max_wait then
  local ticket = {'at', tostring(at)}
  for i = 1, n do
    ticket[#ticket + 1] = 'e' .. i
    ticket[#ticket + 1] = redis.call('HGET', key(i, 1), 'epoch') or '0'
  end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(ticket))
  redis.call('PEXPIRE', KEYS[1], math.floor(wait + grace))
  count('waited')
  return {0, math.floor(wait), 'rate'}
end
go = math.max(go, now)
for i = 1, n do
  if num(i, 2) > 0 then redis.call('HSET', key(i, 1), 'rnext', go + 60000 / num(i, 2)) end
  if num(i, 3) > 0 then redis.call('HSET', key(i, 1), 'tnext', go + est * 60000 / num(i, 3)) end
  if num(i, 4) > 0 then
    redis.call('ZADD', key(i, 2), go + slot_ttl, holder)
    redis.call('ZREM', key(i, 3), holder)
    redis.call('ZREM', key(i, 4), holder)
    for k = 2, 4 do redis.call('EXPIRE', key(i, k), ttl) end
  end
end
redis.call('DEL', KEYS[1])
count('admitted')
return {1, math.floor(math.max(wait, 0)), 'ok'}
"""
)

# After the call: give the slot back, correct the token booking by what was really used
# (est - used is refunded; more is charged) and fold the call time into the mean.
# KEYS: per scope: state, slots. ARGV: holder, est tokens, used tokens (0: a failed call),
# duration ms (-1: none), state ttl s, then per scope: tokens/min
LIMIT_SETTLE = """
local holder, est = ARGV[1], tonumber(ARGV[2])
local used, dur = tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 1, #KEYS / 2 do
  local state = KEYS[2 * i - 1]
  redis.call('ZREM', KEYS[2 * i], holder)
  local tpm = tonumber(ARGV[5 + i])
  if tpm > 0 and redis.call('EXISTS', state) == 1 then
    redis.call('HINCRBYFLOAT', state, 'ttat', (used - est) * 60000 / tpm)
    redis.call('HINCRBYFLOAT', state, 'tnext', (used - est) * 60000 / tpm)
  end
  if dur >= 0 then
    local mean = tonumber(redis.call('HGET', state, 'dur_ms')) or dur
    redis.call('HSET', state, 'dur_ms', mean * 0.8 + dur * 0.2)
  end
  redis.call('EXPIRE', state, ARGV[5])
end
return 1
"""

# A provider said "back off" (429/503/529 with retry-after, or headers with nothing left):
# every worker waits, older bookings are void (epoch) and new ones start after the pause.
# KEYS: state, pause, stats. ARGV: pause ms, state ttl s, scope name, stats field
LIMIT_PAUSE = (
    _NOW
    + """
local ms = tonumber(ARGV[1])
if ms <= 0 then return 0 end
if redis.call('PTTL', KEYS[2]) < ms then redis.call('SET', KEYS[2], '1', 'PX', ms) end
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
for _, f in ipairs({'rtat', 'ttat', 'rnext', 'tnext'}) do
  local v = tonumber(redis.call('HGET', KEYS[1], f)) or 0
  if v < now + ms then redis.call('HSET', KEYS[1], f, now + ms) end
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('HINCRBY', KEYS[3], ARGV[4] .. ':' .. ARGV[3], 1)
return 1
"""
)

# -- tree budgets (fleet.budget) ---------------------------------------------------------
# Each model call reserves its estimate before it is sent; the reservations in flight are
# one field per trace in `held`, so a run redelivered after a crash replaces its own. A call
# is admitted only if used + held + the root's set-aside final turn + its estimate fit.

# KEYS: budget, held, then the provider pause keys of a call the limiter does not book.
# ARGV: trace id, est tokens, est usd, '1' for the root, ttl s
# Returns {3, ms}: the provider is paused for ms more, nothing reserved; {1, 'ok'|'none'}:
# go (none: the tree has no budget); {2, why}: the root's one final turn (the set-aside
# moves into `held`); {0, why, newly}: spent, stop here (newly = 1 when this call found the
# budget spent).
BUDGET_RESERVE = (
    _NOW
    + """
local paused = 0
for i = 3, #KEYS do
  local left = redis.call('PTTL', KEYS[i])
  if left > paused then paused = left end
end
if paused > 0 then return {3, paused, 0} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {1, 'none', 0} end
local id, est, usd = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local f = redis.call('HMGET', KEYS[1], 'exhausted', 'limit_tokens', 'limit_usd',
  'deadline_ms', 'used_tokens', 'used_usd', 'final_tokens', 'final_usd', 'final_used')
local final_tokens, final_usd = tonumber(f[7]) or 0, tonumber(f[8]) or 0
redis.call('HDEL', KEYS[2], id)
local why, newly = f[1], 0
if not why then
  local tokens, dollars = 0, 0
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
    local t, d = string.match(v, '(%S+) (%S+)')
    tokens, dollars = tokens + tonumber(t), dollars + tonumber(d)
  end
  local limit_tokens, limit_usd, deadline = tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
  local spent_tokens = (tonumber(f[5]) or 0) + tokens + final_tokens + est
  local spent_usd = (tonumber(f[6]) or 0) + dollars + final_usd + usd
  if deadline and now >= deadline then why = 'wall_s'
  elseif limit_tokens and spent_tokens > limit_tokens then why = 'tokens'
  elseif limit_usd and spent_usd > limit_usd then why = 'usd' end
  if why then
    redis.call('HSET', KEYS[1], 'exhausted', why)
    newly = 1
  end
end
if why then
  if ARGV[4] == '1' and f[9] ~= '1' then
    local final = final_tokens .. ' ' .. final_usd
    redis.call('HSET', KEYS[1], 'final_used', '1', 'final_tokens', 0, 'final_usd', 0)
    redis.call('HSET', KEYS[2], id, final)
    redis.call('EXPIRE', KEYS[2], ARGV[5])
    return {2, why, newly}
  end
  return {0, why, newly}
end
redis.call('HSET', KEYS[2], id, est .. ' ' .. usd)
redis.call('EXPIRE', KEYS[2], ARGV[5])
return {1, 'ok', 0}
"""
)

# The call is over: its reservation goes, what it really used is added.
# KEYS: budget, held. ARGV: trace id, used tokens, used usd
BUDGET_SETTLE = """
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'used_tokens', ARGV[2])
  redis.call('HINCRBYFLOAT', KEYS[1], 'used_usd', ARGV[3])
end
return 1
"""

# Sub-agents about to be spawned: counted against `sub_agents`, refused when the tree is
# spent or the children would be deeper than `depth`.
# KEYS: budget. ARGV: children, their depth
# Returns {1, ''}: spawn; {0, why, left}: refuse (left: sub-agents still allowed).
BUDGET_SPAWN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {1, '', 0} end
local function get(f) return tonumber(redis.call('HGET', KEYS[1], f)) end
local why = redis.call('HGET', KEYS[1], 'exhausted')
if why then return {0, why, 0} end
local depth = get('limit_depth')
if depth and tonumber(ARGV[2]) > depth then return {0, 'depth', 0} end
local limit, used = get('limit_sub_agents'), get('used_sub_agents') or 0
if limit and used + tonumber(ARGV[1]) > limit then return {0, 'sub_agents', limit - used} end
redis.call('HINCRBY', KEYS[1], 'used_sub_agents', ARGV[1])
return {1, '', 0}
"""

# -- bounded fan-out (fleet.fanout) -------------------------------------------------------

# A tree's run window: children wait in `pending` and at most `limit` hold a slot in
# `running`. Releases the slot of a child that ended, queues new children, and hands out
# the free slots in spawn order. KEYS: running, pending.
# ARGV: limit, ttl s, child that ended ('' for none), new child ids...
# Returns the children to start now.
WINDOW = """
if ARGV[3] ~= '' then redis.call('SREM', KEYS[1], ARGV[3]) end
for i = 4, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
local started = {}
while redis.call('SCARD', KEYS[1]) < tonumber(ARGV[1]) do
  local id = redis.call('LPOP', KEYS[2])
  if not id then break end
  redis.call('SADD', KEYS[1], id)
  started[#started + 1] = id
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return started
"""
