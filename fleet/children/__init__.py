"""Sub-agents: the children a trace spawns and what their outcomes become in the parent.

Owns spawning (`subagents`), settling a child's outcome into the parent's collaborators and
tool results (`settling`), rendering what the parent reads (`collect`) and the result cache.
"""
