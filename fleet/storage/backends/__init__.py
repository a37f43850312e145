"""The trace store's backends: `redis` (the fleet's) and `memory` (one process's).

The layout every capability with backends follows: `<capability>/backends/redis` and
`<capability>/backends/memory` (a module, or a package when a backend takes several); the
capability's package keeps the Protocols and values both implement. Storage's own
capabilities (the store's roles, provider-batch calls, archive) keep theirs here.
"""
