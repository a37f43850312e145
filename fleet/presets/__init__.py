"""Agent presets: which tools a run may use, how long it may loop, what it is told.

Owns `AgentPreset`, the built-in presets and the Markdown preset files a project adds in
`FLEET_AGENTS_DIR` (`preset`), the built-ins' prompts (`prompts`), and a file's
frontmatter text and checks (`frontmatter`). The blocks' schemas (web filters, approval
rules, MCP names) are `fleet.config`'s; it never imports the loop or the runtime.
"""

from fleet.presets.frontmatter import check_schema
from fleet.presets.preset import (
    AGENTS_DIR_ENV,
    ANALYST_TOOLS,
    BUILTIN_PRESETS,
    READ_ONLY_MODES,
    READ_TOOLS,
    TOOL_NAMES,
    AgentPreset,
    get_preset,
    load_preset_file,
    load_presets,
)

__all__ = [
    "AGENTS_DIR_ENV",
    "ANALYST_TOOLS",
    "BUILTIN_PRESETS",
    "READ_ONLY_MODES",
    "READ_TOOLS",
    "TOOL_NAMES",
    "AgentPreset",
    "check_schema",
    "get_preset",
    "load_preset_file",
    "load_presets",
]
