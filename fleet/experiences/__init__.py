"""Experiences: rules learnt from earlier runs, injected into later runs' system prompts.

An experience is *when CONDITION, then RULE*, kept per scope (`agent:default`,
`user:alice`, `project:x`) with its evidence, source, confidence and counts (`model`).
Only approved experiences are ever injected: one proposed from an agent's own output is
untrusted text until a person approves it. `store` holds the Protocol and its memory
twin (the Redis one is `fleet.experiences.backends.redis`); `retrieval` ranks them for a
task (BM25 over condition and rule) and renders the block a preset that opts in shows.
"""
