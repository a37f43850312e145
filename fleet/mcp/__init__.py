"""MCP servers as tools: the operator's `mcp_servers:`, one session per server per process.

- `fleet.config.mcp` (not here): the `mcp_servers:` section of fleet.yaml (stdio `command`,
  or streamable HTTP `url`), checked where fleet.yaml is read (`fleet.llm.config`), and
  `fleet.config.mcp_names` the `mcp__SERVER__TOOL` names.
- `sessions`: `McpSessions`, the process's sessions, on an asyncio loop in a thread (the
  runner is synchronous); a dead server is restarted on the next call.
- `tools`: each server's tools as `mcp__SERVER__TOOL` registry entries, their results as
  `ToolResult`s; the read-only ceiling and the presets' lists apply as to any tool.

Nothing here imports the `mcp` SDK at import time: a fleet without MCP servers never loads it.
"""
