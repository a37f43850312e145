"""Fleet-wide limits: what a model call and a spawn may take, shared by every runner.

Owns provider rate limits and concurrency (`providers`), per-tree budgets (`budget`),
fan-out caps (`fanout`) and tree schedules (`trees`), their Lua scripts and their memory
twins (`memory`, `memory_trees`), the Protocols both implement (`protocols`), the store
capability that picks one (`backends.LIMITS`), and the gate every model call passes
(`gate`). It imports storage keys and capabilities and the LLM configuration, never the
loop or children.
"""
