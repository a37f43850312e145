"""Agent presets: which tools a run may use, how long it may loop, what it is told.

Four presets are built in. A project adds or overrides presets with Markdown files in a
folder (`FLEET_AGENTS_DIR`): YAML frontmatter for the settings, the body as the system
prompt.

    ---
    name: researcher
    description: Reads the code and the web, writes nothing.
    tools: [read_file, grep, web_fetch]
    max_iterations: 20
    read_only: true
    cache: {ttl_s: 3600, keys: [task], tools: [web_search]}  # its answer; its searches
    budget: {tokens: 200000, usd: 2.0, sub_agents: 50}   # default for trees rooted here
    max_branches: 40                                     # per explore call
    max_concurrent: 10                                   # children running at once
    warm_explore: true                                   # first branch warms the cache
    web: {allow_domains: ["*.python.org"]}               # narrows fleet.yaml's filter
    ---
    You are a careful researcher ...
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleet.config import mcp_names
from fleet.config.approval_rules import ApprovalRule, ApproveEntry, rules_of
from fleet.config.limits import PositiveCount
from fleet.config.mcp_names import PREFIX as MCP_PREFIX
from fleet.config.webfilter import DomainRules, WebSection
from fleet.errors import ConfigError
from fleet.limits.budget import Budget, BudgetIn
from fleet.memory.config import MEMORY_TOOLS, NO_MEMORY, Access, MemorySectionIn, MemoryUse, use_of
from fleet.memory.config import READ_TOOLS as MEMORY_READ_TOOLS
from fleet.presets import frontmatter, prompts
from fleet.security import trust
from fleet.security.envvalues import AGENTS_DIR_ENV as AGENTS_DIR_ENV
from fleet.security.envvalues import agents_dir_of

"""Environment variable naming the folder of Markdown preset files."""
READ_TOOLS = frozenset({"read_file", "read_image", "list_dir", "glob", "grep"})
"""The workspace-reading tools every preset may use."""
TOOL_NAMES = frozenset(
    READ_TOOLS
    | {"write_file", "edit_file", "bash", "web_fetch", "skill", "goal", "agent", "evaluate"}
    | {"ask_human", "web_search", "check_messages", "send_message"}
    | MEMORY_TOOLS
)
"""Every tool name a preset file may mention, built-in and runner-handled."""
ANALYST_TOOLS = frozenset({"read_file", "read_image", "glob", "grep", "web_search", "web_fetch"})
"""The built-in `analyst`: reads the workspace and the web, writes nothing."""
READ_MEMORY = frozenset(MEMORY_READ_TOOLS)
"""The memory tools every built-in reader gets (offered only to a tree bound to memory)."""
READ_ONLY_MODES = frozenset({"explore", "evaluate"})
"""Traces in these modes are read-only whatever their preset (or a file replacing it) says."""


@dataclass(frozen=True)
class AgentPreset:
    """How one kind of agent runs. Enforced where tools execute, not by the prompt."""

    name: str
    description: str = ""
    allowed_tools: frozenset[str] | None = None
    """Tools the agent may call; None means every tool."""
    denied_tools: frozenset[str] = frozenset()
    """Tools refused even when `allowed_tools` would let them through."""
    max_iterations: int = 30
    """Model calls before the loop stops."""
    temperature: float | None = None
    """None leaves the model's own default."""
    skills: tuple[str, ...] = ()
    """Skills loaded into the context at start."""
    system_prompt: str = ""
    model: str | None = None
    """Model name or alias; None uses the configured default."""
    read_only: bool = False
    """Refuse every tool that changes the workspace, whatever `allowed_tools` says."""
    approve: tuple[ApprovalRule, ...] = ()
    """Tool calls that wait for a person's `fleet approve` (`fleet.conversation.approval`)."""
    experiences: bool = False
    """Show approved experiences of the run's scopes in its system prompt (`fleet.experiences`)."""
    messages: bool = False
    """Offer `send_message` (to its tree's traces) and `check_messages` from the first turn
    (`fleet.conversation.messages`); without it `check_messages` appears once mail came."""
    cache_ttl_s: int | None = None
    """Cache this agent's result for so long; None disables the cache."""
    cache_keys: tuple[str, ...] = ()
    cache_tools: frozenset[str] = frozenset()
    """Tools of this agent whose results are cached for `cache_ttl_s` (`web_search`)."""
    output_schema: Mapping[str, Any] | None = field(default=None, hash=False)
    """JSON Schema the final answer must meet (`fleet.loop.structured`); None: free text."""
    """Arguments of the `agent` call whose values make up the cache key."""
    budget: Budget | None = None
    """Default budget of a tree whose root runs this preset (the submitter's wins)."""
    max_branches: int | None = None
    """Most branches one explore call of this agent may ask for (else the fleet default)."""
    max_concurrent: int | None = None
    """Default for how many children of a tree rooted here run at once."""
    web: DomainRules | None = None
    """`web: {allow_domains, deny_domains}`: added to fleet.yaml's filter, never replacing it."""
    mcp_servers: frozenset[str] | None = None
    """MCP servers whose tools the agent may use (`mcp:`); None means every declared one."""
    warm_explore: bool | None = None
    """Its explores let the first branch's first call warm the prompt cache before the
    others call (`fleet.children.warming`); None: fleet.yaml's `warm_explore`."""
    memory: MemoryUse = NO_MEMORY
    """`memory:` what it does with the tree's long-term memory (`fleet.memory.config`)."""
    remote_agents: frozenset[str] | None = None
    """`remote_agents:` the A2A agents of fleet.yaml it may call; None means every one."""
    a2a: bool = False
    """`a2a: true`: `fleet a2a` offers it as a skill of the fleet's Agent Card."""

    def allows(self, tool: str) -> bool:
        """Whether this preset lets the agent call `tool` (MCP tools: `fleet.config.mcp_names`)."""
        if tool in self.denied_tools:
            return False
        if tool.startswith(MCP_PREFIX):
            return mcp_names.allows(tool, self.mcp_servers, self.allowed_tools)
        return self.allowed_tools is None or tool in self.allowed_tools

    def within(
        self,
        allowed: Collection[str] | None,
        denied: Collection[str],
        read_only: bool,
        mcp: Collection[str] | None = None,
    ) -> AgentPreset:
        """The preset cut down to a ceiling; it never widens anything.

        Only tools in `allowed` (None: any) and none in `denied` are left, only MCP
        servers in `mcp` (None: any), and it is read-only if `read_only` or if it already was.
        """
        tools = self.allowed_tools
        if allowed is not None:
            tools = frozenset(allowed) if tools is None else tools & frozenset(allowed)
        servers = self.mcp_servers
        if mcp is not None:
            servers = frozenset(mcp) if servers is None else servers & frozenset(mcp)
        denied_tools = self.denied_tools | frozenset(denied)
        read_only = self.read_only or read_only
        if (tools, denied_tools, read_only, servers) == (
            self.allowed_tools, self.denied_tools, self.read_only, self.mcp_servers
        ):  # fmt: skip
            return self  # within the ceiling already (an explore branch, each tool call): no copy
        return replace(
            self,
            allowed_tools=tools,
            denied_tools=denied_tools,
            read_only=read_only,
            mcp_servers=servers,
        )

    def fingerprint(self) -> str:
        """A digest of every setting and the prompt: a changed preset is a new preset."""
        parts = []
        for spec in fields(self):
            value = getattr(self, spec.name)
            shown = sorted(value) if isinstance(value, frozenset) else value
            parts.append(f"{spec.name}={shown!r}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


BUILTIN_PRESETS: Mapping[str, AgentPreset] = MappingProxyType(
    {
        "default": AgentPreset(
            name="default",
            description="General agent with every tool.",
            max_iterations=30,
            system_prompt=prompts.DEFAULT_PROMPT,
            experiences=True,
            memory=MemoryUse(access="read", inject=("profile",)),
        ),
        "explore": AgentPreset(
            name="explore",
            description="Read-only investigation of the workspace.",
            allowed_tools=READ_TOOLS | {"skill"} | READ_MEMORY,
            max_iterations=15,
            read_only=True,
            system_prompt=prompts.EXPLORE_PROMPT,
            memory=MemoryUse(access="read"),
        ),
        "analyst": AgentPreset(
            name="analyst",
            description="Reads the workspace and the web; compares and recommends.",
            allowed_tools=ANALYST_TOOLS | READ_MEMORY,
            max_iterations=25,
            temperature=0.3,
            read_only=True,
            system_prompt=prompts.ANALYST_PROMPT,
            memory=MemoryUse(access="read"),
        ),
        "evaluate": AgentPreset(
            name="evaluate",
            description="Read-only judge that returns a verdict and suggestions.",
            allowed_tools=READ_TOOLS | {"skill"} | READ_MEMORY,
            max_iterations=15,
            read_only=True,
            system_prompt=prompts.EVALUATE_PROMPT,
            memory=MemoryUse(access="read"),
        ),
        "recorder": AgentPreset(
            name="recorder",
            description="Keeps the tree's long-term memory: reads it, writes what is worth it.",
            allowed_tools=MEMORY_TOOLS,
            max_iterations=12,
            temperature=0.0,
            system_prompt=prompts.RECORDER_PROMPT,
            memory=MemoryUse(access="write"),
        ),
    }
)
"""The presets every fleet has; files with the same name replace them."""


class _CacheSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_s: PositiveCount
    keys: list[str] = Field(default_factory=list)
    """`agent` arguments: this agent's answer is cached under their values."""
    tools: list[Literal["web_search"]] = Field(default_factory=list)
    """This agent's calls of these tools are cached (same arguments, same provider)."""

    @model_validator(mode="after")
    def _something(self) -> _CacheSection:
        if not self.keys and not self.tools:
            raise ValueError("cache needs keys (its answer) or tools (its tool results)")
        return self


class _PresetFrontmatter(BaseModel):
    """The frontmatter of a preset file, validated at the edge."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    tools: list[str] | None = None
    denied_tools: list[str] = Field(default_factory=list)
    max_iterations: PositiveCount = 30
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    model: str | None = None
    skills: list[str] = Field(default_factory=list)
    read_only: bool = False
    approve: list[ApproveEntry] = Field(default_factory=list)
    experiences: bool = False
    messages: bool = False
    cache: _CacheSection | None = None
    output_schema: dict[str, Any] | None = None
    budget: BudgetIn | None = None
    max_branches: PositiveCount | None = None
    max_concurrent: PositiveCount | None = None
    web: WebSection | None = None
    mcp: list[str] | None = None
    warm_explore: bool | None = None
    memory: Access | MemorySectionIn | None = None
    remote_agents: list[str] | None = None
    a2a: bool = False


def load_preset_file(path: Path, known_tools: Collection[str] = TOOL_NAMES) -> AgentPreset:
    """Read one Markdown preset file; the name defaults to the file's stem.

    Args:
        path: The `.md` file.
        known_tools: Tool names the file may mention; others are an error.

    Raises:
        ConfigError: One line, `FILE: reason`.
    """
    try:
        header, body = frontmatter.split(path.read_text(encoding="utf-8"))
        front = _validate(frontmatter.parse_yaml(header), default_name=path.stem)
        frontmatter.check_tools(front.tools, front.denied_tools, known_tools)
        frontmatter.check_cache_keys(front.cache.keys if front.cache else [])
        if front.output_schema is not None:
            frontmatter.check_schema(front.output_schema, "frontmatter")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    memory = use_of(front.memory)
    return AgentPreset(
        name=front.name,
        description=front.description,
        # A `tools:` list gets the memory tools its `memory:` access offers.
        allowed_tools=None if front.tools is None else frozenset(front.tools) | memory.tools(),
        denied_tools=frozenset(front.denied_tools),
        max_iterations=front.max_iterations,
        temperature=front.temperature,
        skills=tuple(front.skills),
        system_prompt=body.strip(),
        model=front.model,
        read_only=front.read_only,
        approve=rules_of(front.approve),
        experiences=front.experiences,
        messages=front.messages,
        cache_ttl_s=front.cache.ttl_s if front.cache else None,
        cache_keys=tuple(front.cache.keys) if front.cache else (),
        cache_tools=frozenset(front.cache.tools) if front.cache else frozenset(),
        output_schema=front.output_schema,
        budget=front.budget.to_budget() if front.budget else None,
        max_branches=front.max_branches,
        max_concurrent=front.max_concurrent,
        web=front.web.rules() if front.web else None,
        mcp_servers=None if front.mcp is None else frozenset(front.mcp),
        warm_explore=front.warm_explore,
        memory=memory,
        remote_agents=None if front.remote_agents is None else frozenset(front.remote_agents),
        a2a=front.a2a,
    )


def load_presets(
    agents_dir: Path | None,
    env: Mapping[str, str],
    *,
    known_tools: Collection[str] = TOOL_NAMES,
    workspace_roots: Collection[Path] = (),
) -> dict[str, AgentPreset]:
    """The built-in presets plus every `*.md` preset file in the agents folder.

    Args:
        agents_dir: Folder of preset files; None reads `FLEET_AGENTS_DIR` from `env`,
            and without it only the built-ins are returned.
        env: The environment to read (`Settings.env`).
        known_tools: Tool names preset files may mention.
        workspace_roots: Where agents can write; the folder must lie outside all of them.

    Raises:
        ConfigError: The folder is missing or inside a workspace root, a file is
            malformed, or two files define the same name.
    """
    presets = dict(BUILTIN_PRESETS)
    folder = agents_dir or agents_dir_of(env)
    if folder is None:
        return presets
    if not folder.is_dir():
        raise ConfigError(f"agents folder {str(folder)!r} does not exist")
    if trust.under_roots(folder, workspace_roots):
        # An agent could write a preset there (a writing `explore.md`, a tool-rich helper).
        raise ConfigError(
            f"agents folder {str(folder)!r} is inside a workspace root, where agents can"
            f" write; move it out of {trust.WORKSPACE_ROOTS_ENV}"
        )
    origin: dict[str, Path] = {}
    for path in sorted(folder.glob("*.md")):
        preset = load_preset_file(path, known_tools)
        if preset.name in READ_ONLY_MODES:
            # A file may reword the explorer or the judge; it cannot make them write.
            preset = replace(preset, read_only=True)
        if preset.name in origin:
            raise ConfigError(
                f"{path}: preset {preset.name!r} is also defined in {origin[preset.name]}"
            )
        origin[preset.name] = path
        presets[preset.name] = preset
    return presets


def get_preset(presets: Mapping[str, AgentPreset], name: str) -> AgentPreset:
    """The preset called `name`.

    Raises:
        ConfigError: No such preset; the message lists the known names.
    """
    try:
        return presets[name]
    except KeyError:
        known = ", ".join(presets)
        raise ConfigError(f"unknown preset {name!r} (known: {known})") from None


def _validate(data: dict[str, Any], default_name: str) -> _PresetFrontmatter:
    try:
        return _PresetFrontmatter.model_validate({"name": default_name, **data})
    except ValidationError as exc:
        problems = [frontmatter.describe(error) for error in exc.errors()]
        raise ConfigError("; ".join(problems)) from exc
