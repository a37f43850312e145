"""The trace store: where every trace, message, event, lease and counter lives.

Owns the store's role Protocols (`store`) and its writes (`writes`), their backends
(`backends/redis`: RedisStore, the Lua scripts, the connection, compaction and archive;
`backends/memory`: MemoryStore), every Redis key (`keys`), leases, the outbox and the
watchdog, the provider-batch call queue (`batch_calls`), a tree's images (`images`), and
`capability`: how a package above (limits, experiences) has the store build its service
on Redis or in memory. Tools are handed roles of it (`caches.search_answers`,
`images.image_store`), never this package. Only this package touches the store's Redis
client; the limits' scripts reach it through a capability and name their keys through
`keys`. It imports `fleet.models`, `fleet.errors`, `fleet.ids` and `fleet.security`, never
the loop, children or limits.
"""
