"""Helpers for MCP tests: the test server's fleet.yaml entry and config files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

TEST_SERVER = Path(__file__).with_name("mcp_test_server.py")
RAW_SERVER = Path(__file__).with_name("mcp_raw_server.py")


def server_entry(**extra: Any) -> dict[str, Any]:
    """A `mcp_servers` entry starting `tests/mcp_test_server.py` (isolated: `python -I`)."""
    return {"command": sys.executable, "args": ["-I", str(TEST_SERVER)], **extra}


def write_config(path: Path, servers: dict[str, Any], **sections: Any) -> Path:
    """A fleet.yaml at `path` declaring `servers` (plus other top-level `sections`)."""
    path.write_text(yaml.safe_dump({"mcp_servers": servers, **sections}))
    return path
