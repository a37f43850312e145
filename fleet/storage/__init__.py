"""The trace store: where every trace, message, event, lease and counter lives.

Owns the store's role Protocols (`store`) and its writes (`writes`), their memory and
Redis implementations, the Lua scripts, the Redis connection and the embedded
redis-server, every Redis key (`keys`), leases, the outbox and the watchdog, and
`capability`: how a package above (limits, experiences) has the store build its service
on Redis or in memory. Only this package touches the store's Redis client; the limits'
scripts reach it through a capability and name their keys through `keys`. It imports
`fleet.models`, `fleet.errors` and `fleet.ids`, never the loop, children or limits.
"""
