"""Prompt caching: what lets a provider serve a repeated prompt prefix from its cache.

Every call of a trace repeats the one before it plus a turn, and the branches of an
explore share their system prompt and tool schemas. Two providers' ways of reusing that:

- Anthropic caches only where the request says so: `cache_control: {type: ephemeral}`
  breakpoints (at most `MAX_BREAKPOINTS` per request) on the last tool schema, the system
  prompt and the conversation so far (`mark_breakpoints`).
- OpenAI caches every long prefix by itself, and routes requests with the same
  `prompt_cache_key` to the same cache: one key per preset and tree (`cache_key`), so
  the siblings of an explore land where the first one left its prefix.

The key is a hash of ids only: no task text, no message, no secret reaches the provider
through it.
"""

from __future__ import annotations

import hashlib
from typing import Any

MAX_BREAKPOINTS = 4
"""Anthropic refuses a request with more `cache_control` blocks than this."""
EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
UNCACHEABLE_BLOCKS = frozenset({"thinking", "redacted_thinking"})
"""Block types that cannot carry `cache_control`."""
CACHE_KEY_PREFIX = "fleet-"
CACHE_KEY_HEX = 32


def cache_key(root_trace_id: str, preset: str) -> str:
    """The `prompt_cache_key` of every call of one preset in one tree: a hash of the two."""
    digest = hashlib.sha256(f"{root_trace_id}\0{preset}".encode()).hexdigest()
    return CACHE_KEY_PREFIX + digest[:CACHE_KEY_HEX]


def _marked(block: dict[str, Any]) -> dict[str, Any]:
    # A copy: a passed-through content part is the stored message's own dict.
    return {**block, "cache_control": dict(EPHEMERAL)}


def _mark_last(blocks: list[dict[str, Any]]) -> bool:
    """Mark the last block that may carry a breakpoint; False when none may."""
    for index in range(len(blocks) - 1, -1, -1):
        if blocks[index].get("type") not in UNCACHEABLE_BLOCKS:
            blocks[index] = _marked(blocks[index])
            return True
    return False


def mark_breakpoints(body: dict[str, Any]) -> dict[str, Any]:
    """Put cache breakpoints on an Anthropic Messages body (changed in place and returned).

    In the provider's prefix order: the last tool schema (caches every schema), the system
    prompt (tools + system), the last message (the whole conversation, read back by the
    next turn) and the last user turn before it (what this call reads from the previous
    turn's breakpoint when the last one moved on). Marks already in message content are
    not ours (a content part passed through) and are dropped first, so a request never
    carries more than `MAX_BREAKPOINTS`.
    """
    turns: list[dict[str, Any]] = body.get("messages") or []
    for turn in turns:
        if isinstance(turn.get("content"), list):
            turn["content"] = [_unmarked(block) for block in turn["content"]]
    left = MAX_BREAKPOINTS
    tools: list[dict[str, Any]] = body.get("tools") or []
    if tools and _mark_last(tools):
        left -= 1
    system = body.get("system")
    if isinstance(system, str) and system:
        body["system"] = [_marked({"type": "text", "text": system})]
        left -= 1
    marked_turns = 0
    for turn in reversed(turns):
        if left <= 0 or marked_turns == 2:
            break
        if marked_turns == 1 and turn.get("role") != "user":
            continue
        content = turn.get("content")
        if isinstance(content, list) and _mark_last(content):
            left -= 1
            marked_turns += 1
    return body


def _unmarked(block: Any) -> Any:
    if isinstance(block, dict) and "cache_control" in block:
        return {key: value for key, value in block.items() if key != "cache_control"}
    return block
