"""The preset file format: its YAML frontmatter, validated at the edge.

`PresetFrontmatter` is what a Markdown preset file may say (see `fleet.presets`); the
checks here need nothing of a run. `fleet.presets.preset.load_preset_file` turns one into
an `AgentPreset`.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from fleet.conversation.approval_rules import ApproveEntry
from fleet.errors import ConfigError
from fleet.limits.budget import BudgetIn
from fleet.limits.values import PositiveCount
from fleet.mcp.names import PREFIX as MCP_PREFIX
from fleet.security import yamlsafe
from fleet.tools.webfilter import WebSection

CACHE_ARGUMENTS = ("task", "messages", "context", "skills")
"""`agent` arguments a `cache.keys` entry may name; `context.FIELD` names one field of
`context` (the sub-agent's own arguments, seed-style `city`, `forecast_type`)."""
_CONTEXT_FIELD = re.compile(r"^context\.[A-Za-z_][A-Za-z0-9_]*$")


class _CacheSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_s: PositiveCount
    keys: list[str] = Field(min_length=1)


class PresetFrontmatter(BaseModel):
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
    cache: _CacheSection | None = None
    output_schema: dict[str, Any] | None = None
    budget: BudgetIn | None = None
    max_branches: PositiveCount | None = None
    max_concurrent: PositiveCount | None = None
    web: WebSection | None = None
    mcp: list[str] | None = None

    @classmethod
    def parse(cls, header: str, default_name: str) -> PresetFrontmatter:
        """The YAML between the `---` lines, validated; `ConfigError` names the setting."""
        return _validate(_parse_yaml(header), default_name)

    def check(self, known_tools: Collection[str]) -> None:
        """Tool names it may mention, and `cache.keys` that name an argument of the call."""
        _check_tools(self, known_tools)
        _check_cache_keys(self)


def split_frontmatter(text: str) -> tuple[str, str]:
    """The YAML between the leading `---` lines, and the body after them."""
    lines = text.removeprefix("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise ConfigError("missing YAML frontmatter: the file must start with a '---' line")
    for index, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return "".join(lines[1:index]), "".join(lines[index + 1 :])
    raise ConfigError("frontmatter is not closed by a '---' line")


def _parse_yaml(header: str) -> dict[str, Any]:
    try:
        data = yamlsafe.load(header, "frontmatter")
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML frontmatter: {' '.join(str(exc).split())}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("frontmatter must be a mapping of settings")
    return data


def _validate(data: dict[str, Any], default_name: str) -> PresetFrontmatter:
    try:
        return PresetFrontmatter.model_validate({"name": default_name, **data})
    except ValidationError as exc:
        problems = [_describe(error) for error in exc.errors()]
        raise ConfigError("; ".join(problems)) from exc


def _describe(error: ErrorDetails) -> str:
    """One pydantic error as `field: message`."""
    field = ".".join(str(part) for part in error["loc"])
    message = "unknown setting" if error["type"] == "extra_forbidden" else error["msg"]
    return f"{field}: {message}" if field else str(message)


def _check_tools(front: PresetFrontmatter, known_tools: Collection[str]) -> None:
    for setting, names in (("tools", front.tools or []), ("denied_tools", front.denied_tools)):
        # MCP tools are known only once their server answers: any `mcp__` name may be listed.
        unknown = sorted(n for n in set(names) - set(known_tools) if not n.startswith(MCP_PREFIX))
        if unknown:
            known = ", ".join(sorted(known_tools))
            raise ConfigError(f"{setting}: unknown tool {unknown[0]!r} (known: {known})")


def _check_cache_keys(front: PresetFrontmatter) -> None:
    """Each `cache.keys` entry must name an `agent` argument or a field of `context`.

    A name that matches nothing would read as null in every call, so every call would
    share one cache entry (a Paris forecast answered with Beijing's).
    """
    for name in front.cache.keys if front.cache else []:
        if name not in CACHE_ARGUMENTS and not _CONTEXT_FIELD.match(name):
            known = ", ".join(CACHE_ARGUMENTS)
            raise ConfigError(
                f"cache.keys: unknown argument {name!r} (known: {known};"
                f" a field of the call's context is 'context.{name}')"
            )
