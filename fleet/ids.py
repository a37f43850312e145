"""Trace ids that read as what they are."""

from __future__ import annotations

import secrets
import time


def _stamp() -> str:
    return time.strftime("%Y%m%d%H%M%S", time.gmtime())


def root_id() -> str:
    """`20261126T021500-3f9a2c`: sortable by time, unique by the random tail."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def child_id(parent: str, mode: str, index: int | None = None, attempt: int = 1) -> str:
    """`{parent}@explore-{i:03d}-{timestamp}-001`, `{parent}@delegate-{timestamp}-001`."""
    branch = f"-{index:03d}" if index is not None else ""
    return f"{parent}@{mode}{branch}-{_stamp()}-{attempt:03d}"
