"""The store on Redis: `RedisStore` (`store`), its Lua scripts and writes, the connection.

`store` and `indexes` implement the roles of `fleet.storage.store`; `scripts`,
`lease_scripts`, `fence` and `writes` are the Lua each write runs; `connect` and `urls` the
client (URL forms, TLS, Sentinel, Cluster); `split` the second steps of a fleet-wide index
on a Redis Cluster; `compact` and `archive` a finished tree packed and read or written
whole; `batch_calls` the provider-batch call queue.
"""
