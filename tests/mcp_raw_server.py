"""A hand-written MCP server (stdio, no SDK) whose `tools/call` answers are malformed.

`python -I tests/mcp_raw_server.py MODE`: MODE `shape` answers with `content` that is not a
list; `garbage` writes a line that is not JSON, then nothing.
"""

from __future__ import annotations

import json
import sys
from typing import Any

TOOL = {
    "name": "bad",
    "description": "Answers badly.",
    "inputSchema": {"type": "object", "properties": {}},
    "annotations": {"readOnlyHint": True},
}


def answer(request: dict[str, Any], mode: str) -> str | None:
    method, rid = request.get("method"), request.get("id")
    if rid is None:
        return None  # a notification
    if method == "initialize":
        result: Any = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "0"},
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call" and mode == "garbage":
        return "this is not JSON-RPC " + "x" * 100_000
    elif method == "tools/call":
        result = {"content": "SECRET-LOOKING PAYLOAD " * 1000}
    else:
        return json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result})


def main() -> None:
    mode = sys.argv[1]
    for line in sys.stdin:
        reply = answer(json.loads(line), mode)
        if reply is not None:
            sys.stdout.write(reply + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
