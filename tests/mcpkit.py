"""Helpers for MCP tests: the test server's fleet.yaml entry and config files."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml

from fleet.mcp.sessions import McpSessions
from fleet.mcp.tools import sync
from fleet.tools.registry import ToolRegistry, default_registry

TEST_SERVER = Path(__file__).with_name("mcp_test_server.py")
RAW_SERVER = Path(__file__).with_name("mcp_raw_server.py")


def server_entry(**extra: Any) -> dict[str, Any]:
    """A `mcp_servers` entry starting `tests/mcp_test_server.py` (isolated: `python -I`)."""
    return {"command": sys.executable, "args": ["-I", str(TEST_SERVER)], **extra}


def write_config(path: Path, servers: dict[str, Any], **sections: Any) -> Path:
    """A fleet.yaml at `path` declaring `servers` (plus other top-level `sections`)."""
    path.write_text(yaml.safe_dump({"mcp_servers": servers, **sections}))
    return path


def listed(sessions: McpSessions, *servers: str, timeout_s: float = 60.0) -> ToolRegistry:
    """A registry synced until each of `servers` has listed its tools.

    A turn waits for a server's first listing at most `FIRST_LISTING_WAIT_S`, then goes on
    without it (its own test holds that bound); a loaded machine may start a server's Python
    slower than that, and these tests check what the listing gives, not how soon.
    """
    registry = default_registry()
    deadline = time.monotonic() + timeout_s
    sync(registry, sessions)
    while not all(any(n.startswith(f"mcp__{s}__") for n in registry.names()) for s in servers):
        assert time.monotonic() < deadline, f"no first listing from {servers} in {timeout_s} s"
        sessions.changed.wait(0.2)
        sync(registry, sessions)
    return registry
