"""Which tool calls wait for a person's approval: `approve:` in a preset or in fleet.yaml.

An entry is a tool name (`bash`), or a tool with glob patterns on its arguments
(`{tool: write_file, arguments: {path: "*.py"}}`): the call needs approval when every
named argument matches its pattern. Patterns only narrow a rule; a tool listed by name
alone waits for every call. Tool names may be globs too (`mcp__*`).

A pattern on a built-in tool's `path` is matched against the path as the tool will act on
it, not only as written: `evil.py/.` and `sub/../evil.py/` write `evil.py`, so `*.py`
matches them. The caller passes the forms (`PathForms`): the path as written, folded
below the workspace root, and with every symlink followed, each relative to the root and
absolute; the call needs approval when any form matches. Matching more only asks more.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PathForms = Callable[[str], tuple[str, ...]]
"""The forms of a built-in tool's `path` argument that patterns are matched against."""
PATH_ARGUMENT = "path"
"""The argument the built-in file tools (read/write/edit_file, list_dir, glob, grep,
read_image) resolve in the workspace; an MCP tool's (`mcp__...`) is its server's business."""


def as_written(path: str) -> tuple[str, ...]:
    """No resolution: the path only as the model wrote it."""
    return (path,)


@dataclass(frozen=True)
class ApprovalRule:
    """Calls of `tool` (a glob) whose arguments match every pattern need approval."""

    tool: str
    arguments: tuple[tuple[str, str], ...] = ()
    """(argument name, glob) pairs; all must match. Empty: every call of the tool."""

    def matches(
        self, name: str, arguments: Mapping[str, Any], paths: PathForms = as_written
    ) -> bool:
        """Whether a call of `name` with these (parsed) arguments needs approval."""
        if not fnmatchcase(name, self.tool):
            return False
        return all(
            any(fnmatchcase(form, glob) for form in _forms(name, key, arguments.get(key), paths))
            for key, glob in self.arguments
        )


class ApprovalRuleIn(BaseModel):
    """One `approve:` entry written as a mapping, validated at the edge."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tool: str = Field(min_length=1)
    arguments: dict[str, str] = Field(default_factory=dict)


ApproveEntry = str | ApprovalRuleIn
"""What an `approve:` list holds in a preset's frontmatter or in fleet.yaml."""


def rules_of(entries: Iterable[ApproveEntry]) -> tuple[ApprovalRule, ...]:
    """The validated entries as rules."""
    rules = []
    for entry in entries:
        if isinstance(entry, str):
            rules.append(ApprovalRule(entry))
        else:
            rules.append(ApprovalRule(entry.tool, tuple(sorted(entry.arguments.items()))))
    return tuple(rules)


def needs_approval(
    rules: Sequence[ApprovalRule], name: str, arguments: str, paths: PathForms = as_written
) -> bool:
    """Whether a call (its raw JSON arguments) matches a rule.

    `paths` gives the forms of a built-in tool's `path` argument to match (see above).

    Arguments that do not parse match a tool-only rule; the call is then refused for its
    arguments before anything runs, so a pattern rule need not match them.
    """
    if not any(fnmatchcase(name, rule.tool) for rule in rules):
        return False
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return any(fnmatchcase(name, r.tool) and not r.arguments for r in rules)
    return any(rule.matches(name, parsed, paths) for rule in rules)


def _forms(name: str, key: str, value: Any, paths: PathForms) -> tuple[str, ...]:
    """What a pattern on argument `key` is matched against."""
    text = _text(value)
    if key != PATH_ARGUMENT or name.startswith("mcp__") or not isinstance(value, str):
        return (text,)
    return (text, *paths(value))


def _text(value: Any) -> str:
    """An argument as patterns see it: strings as they are, anything else as JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
