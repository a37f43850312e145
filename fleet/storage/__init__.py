"""The trace store: where every trace, message, event, lease and counter lives.

Owns the store Protocols (`store`, `writes`), their memory and Redis implementations, the
Lua scripts, the Redis connection and the embedded redis-server, every Redis key
(`keys`), leases, the outbox and the watchdog. Only this package (and `fleet.limits`'
scripts, through `keys`) touches Redis. It imports `fleet.models`, `fleet.errors` and
`fleet.ids`, never the loop, children or limits.
"""
