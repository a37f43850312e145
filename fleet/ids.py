"""Trace ids that read as what they are, and the names of long-term memory (`fleet.memory`)."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from fleet.errors import InvalidTraceId, MemoryRefused

TRACE_ID = re.compile(r"[A-Za-z0-9@._-]{1,512}")
"""What every trace id matches: no `:` (it would name another Redis key), no `*`, no spaces
or control characters. Checked wherever an id comes in (CLI, API, task arguments, keys)."""


def check_trace_id(value: str) -> str:
    """`value` if it can be a trace id, else `InvalidTraceId` with a one-line message.

    The message quotes at most 60 characters of the value with `!r`, so a hostile id
    cannot put escape sequences or a wall of text on a terminal.
    """
    if not isinstance(value, str) or not TRACE_ID.fullmatch(value):
        shown = value[:60] if isinstance(value, str) else value
        raise InvalidTraceId(f"invalid trace id {shown!r}: use only letters, digits and @ . _ -")
    return value


def _stamp() -> str:
    return time.strftime("%Y%m%d%H%M%S", time.gmtime())


def root_id() -> str:
    """`20261126T021500-3f9a2c`: sortable by time, unique by the random tail."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def child_id(parent: str, mode: str, index: int | None = None, attempt: int = 1) -> str:
    """`{parent}@explore-{i:03d}-{timestamp}-001`, `{parent}@delegate-{timestamp}-001`."""
    branch = f"-{index:03d}" if index is not None else ""
    return f"{parent}@{mode}{branch}-{_stamp()}-{attempt:03d}"


def root_of(trace_id: str) -> str:
    """The root a fleet-made trace id names (`{root}@...@...`); a guess for ids made elsewhere."""
    return trace_id.split("@", 1)[0] or trace_id


MEMORY_NAMESPACE = re.compile(r"fleet|[a-z][a-z0-9_-]{0,19}:[A-Za-z0-9_.@-]{1,100}")
"""A memory namespace: `KIND:NAME` (`user:alice`) or the shared `fleet`. It reaches Redis
key names and prompts, so a short run of plain characters."""
MEMORY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
"""A memory key within a namespace (`profile`, `agent_errors`): no `:`, no spaces."""


def check_memory_namespace(namespace: Any, where: str = "memory") -> str:
    """The namespace, or `MemoryRefused` saying what one looks like."""
    if not isinstance(namespace, str) or not MEMORY_NAMESPACE.fullmatch(namespace):
        shown = namespace if isinstance(namespace, str) else type(namespace).__name__
        raise MemoryRefused(
            f"{where}: namespace {shown[:120]!r}: expected KIND:NAME (user:alice,"
            " project:acme) or fleet (letters, digits, _ . @ -)"
        )
    return namespace


def check_memory_key(key: Any, where: str = "memory") -> str:
    """The key, or `MemoryRefused` saying what one looks like."""
    if not isinstance(key, str) or not MEMORY_KEY.fullmatch(key):
        shown = key if isinstance(key, str) else type(key).__name__
        raise MemoryRefused(
            f"{where}: key {shown[:120]!r}: expected up to 100 letters, digits, _ . -"
            " (starting with a letter or digit)"
        )
    return key
