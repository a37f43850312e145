"""A hand-written MCP server (stdio, no SDK) that answers badly, slowly or hugely.

`python -I tests/mcp_raw_server.py MODE`. Tool `bad`: MODE `shape` answers with `content`
that is not a list; `garbage` writes a line that is not JSON, then nothing. MODE
`hang_relist` answers the first `tools/list` and never another; `hang_list` never answers
one; `slow_list` answers each after 7 s. In every mode `echo` answers its text, `relist` sends
`notifications/tools/list_changed` first, and `big` answers with `chars` characters in one
line (64 MiB if not told), read and answered in order like every request; `freeze` stops
the server reading anything (a wedged server) for an hour.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

SCHEMA = {"type": "object", "properties": {}}
HINT = {"readOnlyHint": True}
TOOLS = [
    {"name": name, "description": f"{name}.", "inputSchema": SCHEMA, "annotations": HINT}
    for name in ("bad", "echo", "relist", "big", "freeze")
]
BIG_CHARS = 64 * 1024 * 1024
SLOW_LIST_S = 7.0
listed = 0


def reply(rid: Any, result: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result})


def text(rid: Any, value: str) -> str:
    return reply(rid, {"content": [{"type": "text", "text": value}]})


def call(request: dict[str, Any], mode: str) -> str | None:
    rid, params = request["id"], request.get("params") or {}
    name, arguments = params.get("name"), params.get("arguments") or {}
    if name == "echo":
        return text(rid, f"echo: {arguments.get('text', '')}")
    if name == "relist":
        notice = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        return json.dumps(notice) + "\n" + text(rid, "relisted")
    if name == "freeze":
        time.sleep(3600)
    if name == "big":
        return text(rid, "x" * int(arguments.get("chars", BIG_CHARS)))
    if mode == "garbage":
        return "this is not JSON-RPC " + "x" * 100_000
    return reply(rid, {"content": "SECRET-LOOKING PAYLOAD " * 1000})


def answer(request: dict[str, Any], mode: str) -> str | None:
    global listed
    method, rid = request.get("method"), request.get("id")
    if rid is None:
        return None  # a notification
    if method == "initialize":
        return reply(
            rid,
            {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "raw", "version": "0"},
            },
        )
    if method == "tools/list":
        listed += 1
        if mode == "hang_list" or (mode == "hang_relist" and listed > 1):
            return None  # never answered
        if mode == "slow_list":
            time.sleep(SLOW_LIST_S)
        return reply(rid, {"tools": TOOLS})
    if method == "tools/call":
        return call(request, mode)
    if method == "ping":
        return reply(rid, {})
    return json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})


def main() -> None:
    mode = sys.argv[1]
    for line in sys.stdin:
        out = answer(json.loads(line), mode)
        if out is not None:
            sys.stdout.write(out + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
