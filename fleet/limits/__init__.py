"""Fleet-wide limits: what a model call and a spawn may take, shared by every runner.

Owns provider rate limits and concurrency (`providers`), per-tree budgets (`budget`),
fan-out caps (`fanout`), tree schedules (`trees`) and search counts (`searches`), their
backends (`backends/redis`: the Lua scripts; `backends/memory`: the twins), the Protocols
both implement (`protocols`), the store capability that picks one (`capability.LIMITS`),
and the gate every model call passes (`gate`). The value types of fleet.yaml's `limits:`
block are `fleet.config.limits`. It imports storage keys and capabilities and the LLM
configuration, never the loop or children.
"""
