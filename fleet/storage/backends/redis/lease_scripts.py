"""The Lua scripts of `RedisIndexes`: leases, their heartbeat, and the due-time claim.

A lease's Lua, not a trace write's (those are `fleet.storage.backends.redis.scripts`): these
touch the lease keys and the fleet-wide indexes, never a trace's hash.
"""

from __future__ import annotations

from fleet.storage.backends.redis.scripts import BULK

# KEYS: lease, running index (a stand-in in a cluster). ARGV: owner, ttl_ms, deadline_ms,
# trace id, '1' when the caller indexes the lease (a cluster)
ACQUIRE_LEASE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if ARGV[5] ~= '1' then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4]) end
return 1
"""

# KEYS: lease, running index (a stand-in in a cluster). ARGV: owner, trace id, '1' when the
# caller unindexes the lease (a cluster)
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '1' then redis.call('ZREM', KEYS[2], ARGV[2]) end
return 1
"""

# KEYS: the leases of one slot (a cluster, where a worker's leases are in many slots: one tree's
# share its root's). ARGV: ttl_ms, then one owner per lease. 1 per lease renewed (still its
# owner's), else 0.
RENEW_SLOT = """
local renewed = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i + 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
"""

# KEYS: running index, then one lease per held trace. ARGV: ttl_ms, deadline_ms, then an
# owner and a trace id per lease. Returns 1 per lease still ours (renewed), else 0. One
# heartbeat renews every lease of a worker process: 2 commands per lease, one ZADD for all.
RENEW_LEASES = (
    BULK
    + """
local renewed, indexed = {}, {}
for i = 2, #KEYS do
  local owner, trace = ARGV[2 * i - 1], ARGV[2 * i]
  if redis.call('GET', KEYS[i]) == owner then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    indexed[#indexed + 1] = ARGV[2]
    indexed[#indexed + 1] = trace
    renewed[i - 1] = 1
  else
    renewed[i - 1] = 0
  end
end
if #indexed > 0 then bulk('ZADD', KEYS[1], indexed) end
return renewed
"""
)


# KEYS: a sorted set scored by due time (ms). ARGV: now_ms, next due ms, limit.
# Members due by now are pushed back to the next due time and returned: each to one caller,
# and one that caller fails to finish comes due again.
CLAIM_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], member) end
return due
"""
