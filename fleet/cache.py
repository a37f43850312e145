"""Sub-agent result cache: a preset with `cache: {ttl_s, keys}` answers identical calls from Redis.

The key is the preset plus a hash of the `agent` call's arguments named in `cache.keys`, so
the same delegate call anywhere in the fleet is answered once per TTL.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fleet import keys
from fleet.llm.base import ToolCall
from fleet.models import Trace
from fleet.presets import AgentPreset
from fleet.store import TraceStore


def cache_key(preset: AgentPreset, arguments: dict[str, Any]) -> str | None:
    """The store key for this call, or None when the preset does not cache."""
    if not preset.cache_ttl_s or not preset.cache_keys:
        return None
    picked = {name: arguments.get(name) for name in preset.cache_keys}
    blob = json.dumps(picked, sort_keys=True, ensure_ascii=False, default=str)
    return keys.cache(preset.name, hashlib.sha256(blob.encode()).hexdigest()[:32])


def delegate_preset(call: ToolCall) -> tuple[str, dict[str, Any]] | None:
    """(preset name, arguments) for a plain delegate call; None for anything else."""
    if call.name != "agent":
        return None
    try:
        arguments = call.parsed_arguments()
    except ValueError:
        return None
    if not isinstance(arguments.get("task"), str) or arguments.get("continue_from"):
        return None
    return str(arguments.get("agent_type") or "default"), arguments


def remember(store: TraceStore, child: Trace, result: str) -> None:
    """Store a completed child's tool result under the key it was spawned with."""
    key, ttl_s = child.metadata.get("cache_key"), child.metadata.get("cache_ttl_s")
    if key and ttl_s and child.status == "completed":
        store.cache_set(str(key), result, int(ttl_s))
