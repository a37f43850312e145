"""The Lua scripts of the fleet-wide limits: provider limits, tree budgets, run windows.

Each is one atomic round trip on the keys in `fleet.storage.keys`; the trace store's own scripts
are in `fleet.storage.backends.redis.scripts`.
"""

from __future__ import annotations

# -- provider limits (fleet.limits.providers) ---------------------------------------------
# A scope is a provider+key or a model alias. Requests and tokens are paced by GCRA with no
# burst (each admission books the next free time: `rtat`/`ttat`), so bookings are handed
# out in arrival order and a trace that was handed back keeps its place (its ticket). The
# admissions themselves are also spaced from the last one (`rnext`/`tnext`): turns taken
# late, or after a pause, never go out as a burst. The spacing (ms per request, ms per
# token) comes from `fleet.limits.pacing`, margin for jitter included; `turns` there is this
# model in Python.
# Concurrency is a semaphore (sorted set with deadlines, so a dead worker's slot lapses)
# with a first-come-first-served line. Time is Redis's own clock: every worker agrees.

_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS: ticket, stats, then per scope: state, slots, line, seen, pause
# ARGV: holder, est tokens, max_wait_ms, slot_ttl_ms, ticket grace ms, line stale ms,
#       state ttl s, then per scope: name, ms per request, ms per token, max concurrency
#       (0: no such limit)
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
if not at then
  at = now
  for i = 1, n do
    if num(i, 2) > 0 and field(i, 'rtat') > at then at = field(i, 'rtat') end
    if num(i, 3) > 0 and field(i, 'ttat') > at then at = field(i, 'ttat') end
  end
  for i = 1, n do
    if num(i, 2) > 0 then redis.call('HSET', key(i, 1), 'rtat', at + num(i, 2)) end
    if num(i, 3) > 0 then redis.call('HSET', key(i, 1), 'ttat', at + est * num(i, 3)) end
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
  redis.call('HSET', KEYS[1], 'at', tostring(at))
  redis.call('PEXPIRE', KEYS[1], math.floor(wait + grace))
  count('waited')
  return {0, math.floor(wait), 'rate'}
end
go = math.max(go, now)
for i = 1, n do
  if num(i, 2) > 0 then redis.call('HSET', key(i, 1), 'rnext', go + num(i, 2)) end
  if num(i, 3) > 0 then redis.call('HSET', key(i, 1), 'tnext', go + est * num(i, 3)) end
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

# Right before a booked call leaves: the provider's pause once more (a 429 elsewhere while
# it slept on its turn), then the sends themselves, counted in a sliding log per scope: at
# most `most` in any `window` ms (`fleet.limits.pacing.send_wait_ms` is this in Python).
# KEYS: per scope: pause, sends. ARGV: a member naming this send, then per scope: window
# ms, most sends (0: no request limit, only the pause is checked)
# Returns {1, 0, 'ok'}: go, the send is logged; {0, ms, 'pause' | 'window'}: not before ms.
LIMIT_SEND = (
    _NOW
    + """
local n = #KEYS / 2
local paused = 0
for i = 1, n do
  local left = redis.call('PTTL', KEYS[2 * i - 1])
  if left > paused then paused = left end
end
if paused > 0 then return {0, paused, 'pause'} end
local wait = 0
for i = 1, n do
  local window, most = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  if most > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', now - window)
    local count = redis.call('ZCARD', KEYS[2 * i])
    if count >= most then
      local leaving = redis.call('ZRANGE', KEYS[2 * i], count - most, count - most, 'WITHSCORES')
      wait = math.max(wait, tonumber(leaving[2]) + window - now)
    end
  end
end
if wait > 0 then return {0, math.ceil(wait), 'window'} end
for i = 1, n do
  if tonumber(ARGV[2 * i + 1]) > 0 then
    redis.call('ZADD', KEYS[2 * i], now, ARGV[1])
    redis.call('PEXPIRE', KEYS[2 * i], math.ceil(tonumber(ARGV[2 * i])))
  end
end
return {1, 0, 'ok'}
"""
)

# After the call: give the slot back, correct the token booking by what was really used
# (est - used is refunded; more is charged) and fold the call time into the mean.
# KEYS: per scope: state, slots. ARGV: holder, est tokens, used tokens (0: a failed call),
# duration ms (-1: none), state ttl s, then per scope: ms per token (0: no token limit)
LIMIT_SETTLE = """
local holder, est = ARGV[1], tonumber(ARGV[2])
local used, dur = tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 1, #KEYS / 2 do
  local state = KEYS[2 * i - 1]
  redis.call('ZREM', KEYS[2 * i], holder)
  local per_token = tonumber(ARGV[5 + i])
  if per_token > 0 and redis.call('EXISTS', state) == 1 then
    redis.call('HINCRBYFLOAT', state, 'ttat', (used - est) * per_token)
    redis.call('HINCRBYFLOAT', state, 'tnext', (used - est) * per_token)
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
# every worker waits out the pause and nothing is booked inside it. Bookings made before it
# keep their turns: those that fell inside the pause go as soon as it ends, spaced from one
# another (`rnext`), and the later ones as booked. (Voiding them instead sent every ticket
# to the back of the line: the fleet then idled for as long as the line was, seconds, after
# a 429 that asked for 0.3 s.)
# KEYS: state, pause, stats. ARGV: pause ms, state ttl s, scope name, stats field
LIMIT_PAUSE = (
    _NOW
    + """
local ms = tonumber(ARGV[1])
if ms <= 0 then return 0 end
if redis.call('PTTL', KEYS[2]) < ms then redis.call('SET', KEYS[2], '1', 'PX', ms) end
for _, f in ipairs({'rtat', 'ttat', 'rnext', 'tnext'}) do
  local v = tonumber(redis.call('HGET', KEYS[1], f)) or 0
  if v < now + ms then redis.call('HSET', KEYS[1], f, now + ms) end
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('HINCRBY', KEYS[3], ARGV[4] .. ':' .. ARGV[3], 1)
return 1
"""
)

# -- tree budgets (fleet.limits.budget) ---------------------------------------------------------
# Each model call reserves its estimate before it is sent; the reservations in flight are
# one field per trace in `held`, so a run redelivered after a crash replaces its own. A call
# is admitted only if used + held + the root's set-aside final turn + its estimate fit.
# A root run again while it still holds its final turn (its runner died or froze past its
# lease during that call, never settled) gets that turn again: refused, the recovered root
# ended with no answer at all (make chaos seed 40 round 15, a worker frozen on the turn).

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
local mine = redis.call('HGET', KEYS[2], id)
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
  if ARGV[4] == '1' and mine then
    redis.call('HSET', KEYS[2], id, mine)
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

# The call is over: its reservation goes, what it really used is added. A refunded final
# turn (the root's last call never went out: a limit handed it back, the call failed) puts
# the set-aside back, so the root still gets that turn when it asks again.
# KEYS: budget, held. ARGV: trace id, used tokens, used usd, '1' to give a final turn back
BUDGET_SETTLE = """
local held = ARGV[4] == '1' and redis.call('HGET', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  if held then
    local t, d = string.match(held, '(%S+) (%S+)')
    redis.call('HSET', KEYS[1], 'final_used', '0', 'final_tokens', t, 'final_usd', d)
  end
  redis.call('HINCRBY', KEYS[1], 'used_tokens', ARGV[2])
  redis.call('HINCRBYFLOAT', KEYS[1], 'used_usd', ARGV[3])
end
return 1
"""

# A trace ended: what it still holds goes (a call whose settle was lost: a write that
# failed mid-failover, then a stop), and the root's end gives back its set-aside final
# turn. A root continued later gets its set-aside again (unless its final turn was used).
# Idempotent: a second release, or a settle after it, finds nothing held.
# KEYS: budget, held. ARGV: trace id, 'end' (a branch), 'root' (the root ended) or
# 'reopen' (the root continued: ARGV[1] unused), the final share
BUDGET_RELEASE = """
if ARGV[2] ~= 'reopen' then redis.call('HDEL', KEYS[2], ARGV[1]) end
if ARGV[2] == 'end' or redis.call('EXISTS', KEYS[1]) == 0 then return 1 end
if ARGV[2] == 'root' then
  redis.call('HSET', KEYS[1], 'final_tokens', 0, 'final_usd', 0)
elseif redis.call('HGET', KEYS[1], 'final_used') ~= '1' then
  local f = redis.call('HMGET', KEYS[1], 'limit_tokens', 'limit_usd')
  local share = tonumber(ARGV[3])
  if f[1] then redis.call('HSET', KEYS[1], 'final_tokens', math.floor(tonumber(f[1]) * share)) end
  if f[2] then redis.call('HSET', KEYS[1], 'final_usd', tonumber(f[2]) * share) end
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

# -- bounded fan-out (fleet.limits.fanout) -------------------------------------------------------

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
