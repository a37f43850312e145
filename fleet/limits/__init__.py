"""Fleet-wide limits: what a model call and a spawn may take, shared through Redis.

Owns provider rate limits and concurrency (`providers`), per-tree budgets (`budget`),
fan-out caps (`fanout`) and tree counters (`trees`), their Lua scripts, and the gate every
model call passes (`gate`). It imports storage keys and the LLM configuration, never the
loop or children.
"""
