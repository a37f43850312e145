"""Deterministic stand-ins for tests and users: scripted models and the in-memory store.

Test support, public (DESIGN.md names it): production code never imports this module
(tests/test_imports.py checks it); the scripted model itself lives in `fleet.llm.scripted`,
where `scripted:FILE.yaml` models load from.
"""

from __future__ import annotations

from fleet.llm.scripted import Script, ScriptedModel, call, calls, text
from fleet.storage.backends.memory.store import MemoryStore

__all__ = ["MemoryStore", "Script", "ScriptedModel", "call", "calls", "text"]
