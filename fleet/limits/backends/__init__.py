"""The limits' backends: Lua scripts on Redis (`redis`) and their memory twins (`memory`).

Which one a store keeps is `fleet.limits.capability.LIMITS`.
"""
