"""The schemas of fleet.yaml's and preset files' blocks, below every package that reads them.

Owns the value types of `limits:` (`limits`), `approve:` rules (`approval_rules`), `web:`
domain filters (`webfilter`), `search:` (`search`), `mcp_servers:` (`mcp`) and the
`mcp__SERVER__TOOL` names (`mcp_names`), and the shell's limits (`shell`, FLEET_SHELL_*).
`fleet.llm.config` (fleet.yaml), `fleet.presets` (preset files) and `fleet.settings`
validate with them; the packages that act on them (limits, conversation, tools, mcp) read
them. It imports only the base (`fleet.errors`), so each block has one schema and no
package climbs to another's for it.
"""
