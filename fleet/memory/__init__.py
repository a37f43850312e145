"""Long-term memory: namespaced entries every agent of a bound tree reads, one recorder writes.

A namespace (`user:alice`, `project:acme`, `fleet`) holds entries `{key, value, version,
updated_at_ms, source_trace, writer}`, each with a bounded history. The submitter binds
the namespaces a tree may use (`Trace.memory`); a model names only keys. Writes are
compare-and-set on the version, so two writers on two machines never lose an update
silently: the loser is told the current version.

`names` checks names and holds the caps; `model` the entry and the outcomes of a write;
`board` the storage Protocol, its memory twin and the capability; `redis_board` the Redis
implementation (one Lua script per write); `search` ranks entries for `memory_search`.
"""
