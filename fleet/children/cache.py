"""Sub-agent result cache: a preset with `cache: {ttl_s, keys}` answers identical calls from Redis.

The key hashes the `agent` call's arguments named in `cache.keys` (a top-level argument
such as `task`, or `context.FIELD` for one field of `context`) together with everything
else that changes the answer: the workspace, the child's model and tool ceiling, and the
preset's whole content. So the same delegate call in the same place is answered once per
TTL anywhere in the fleet, and a tree in another workspace, on another model, or after the
preset file changed never gets that answer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from fleet.llm.base import ToolCall
from fleet.models import Trace
from fleet.presets import AgentPreset
from fleet.storage import keys
from fleet.storage.store import Services


@dataclass(frozen=True)
class CacheScope:
    """Where and how a call runs: part of its cache key, next to the chosen arguments."""

    workspace: str
    model: str
    ceiling: str
    """The child's tool ceiling, serialised."""


def cache_key(preset: AgentPreset, arguments: dict[str, Any], scope: CacheScope) -> str | None:
    """The store key for this call, or None when the preset does not cache."""
    if not preset.cache_ttl_s or not preset.cache_keys:
        return None
    picked = {name: pick(arguments, name) for name in preset.cache_keys}
    blob = json.dumps(
        {"args": picked, "scope": asdict(scope), "preset": preset.fingerprint()},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return keys.cache(preset.name, hashlib.sha256(blob.encode()).hexdigest()[:32])


def pick(arguments: dict[str, Any], name: str) -> Any:
    """The value `name` selects: a top-level argument, or `context.FIELD`."""
    if name.startswith("context."):
        context = arguments.get("context")
        return context.get(name.removeprefix("context.")) if isinstance(context, dict) else None
    return arguments.get(name)


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


def remember(store: Services, child: Trace, result: str) -> None:
    """Store a completed child's tool result under the key it was spawned with."""
    key, ttl_s = child.run.cache_key, child.run.cache_ttl_s
    if key and ttl_s and child.status == "completed":
        store.cache_set(key, result, ttl_s)
