"""MCP servers as tools: the operator's `mcp_servers:`, one session per server per process.

- `config`: the `mcp_servers:` section of fleet.yaml (stdio `command`, or streamable HTTP
  `url`), checked where fleet.yaml is read (`fleet.llm.config`).
- `sessions`: `McpSessions`, the process's sessions, on an asyncio loop in a thread (the
  runner is synchronous); a dead server is restarted on the next call.
- `tools`: each server's tools as `mcp__SERVER__TOOL` registry entries, their results as
  `ToolResult`s; the read-only ceiling and the presets' lists apply as to any tool.

Nothing here imports the `mcp` SDK at import time: a fleet without MCP servers never loads it.
"""
