"""Warming the prompt cache for an explore: the first branch's first call goes ahead alone.

The branches of an explore send the same system prompt and tool schemas at once, so each
of them misses the provider's prompt cache (a prefix is readable only once the call that
wrote it answered) and pays full price, or Anthropic's cache-write price, for it. With
`warm_explore` (fleet.yaml, or a preset's frontmatter for the explores its agents start),
every branch but the first is marked at spawn; such a branch's first model call waits,
handed back like a rate-limited call (no slot held, `WARM_POLL_S` between looks), until
the first branch has answered its first call or ended, then reads the shared prefix from
the cache. It costs the branches one model call of latency; `bench/cache_bench.py`
measures both sides (docs/performance.md).
"""

from __future__ import annotations

from fleet.errors import TraceNotFound
from fleet.limits.gate import Wait
from fleet.models import Trace, now_ms
from fleet.presets import AgentPreset
from fleet.storage.store import TraceStore

WARM_POLL_S = 0.5
"""How long a waiting branch is handed back for before it looks again."""
WARM_MAX_WAIT_S = 60.0
"""A branch waits at most this long after it was created (a first branch stuck in a queue
must not hold its siblings back for longer)."""


def warms(preset: AgentPreset, fleet_default: bool) -> bool:
    """Whether the explores of an agent running `preset` warm the cache."""
    return fleet_default if preset.warm_explore is None else preset.warm_explore


def warming(store: TraceStore, trace: Trace) -> Wait | None:
    """A `Wait` while this branch's first call must let the first branch's go first."""
    if not trace.run.warm_after_first or trace.iteration > 0 or not trace.parent_trace_id:
        return None
    if now_ms() - trace.created_at_ms > WARM_MAX_WAIT_S * 1000:
        return None
    first = _first_sibling(store, trace)
    if first is None or first.iteration > 0 or first.is_terminal:
        return None
    return Wait(WARM_POLL_S, "warming the prompt cache")


def _first_sibling(store: TraceStore, trace: Trace) -> Trace | None:
    """The first branch of the call that spawned `trace` (None: gone, or `trace` itself)."""
    assert trace.parent_trace_id is not None
    siblings = [
        entry.trace_id
        for entry in store.collaborators(trace.parent_trace_id)
        if entry.tool_call_id == trace.parent_tool_call_id and entry.type == "agent"
    ]
    if not siblings or siblings[0] == trace.trace_id:
        return None
    try:
        return store.get_trace(siblings[0])
    except TraceNotFound:  # expired, or never written: nothing to wait for
        return None
