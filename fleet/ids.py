"""Trace ids that read as what they are."""

from __future__ import annotations

import re
import secrets
import time

from fleet.errors import InvalidTraceId

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
