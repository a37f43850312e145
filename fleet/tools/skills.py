"""The `skill` tool: Markdown playbooks loaded on demand by name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fleet.errors import ToolError
from fleet.tools.base import ToolContext, ToolResult

BUILTIN_SKILLS_DIR = Path(__file__).resolve().parent.parent / "skills"
"""The skills shipped with agent-fleet; project folders are searched first."""


def available_skills(skills_dirs: Sequence[Path]) -> dict[str, Path]:
    """Every skill name with its file; the first folder that has a name wins.

    Args:
        skills_dirs: Project skill folders, searched in order before the built-in one.
    """
    found: dict[str, Path] = {}
    for folder in (*skills_dirs, BUILTIN_SKILLS_DIR):
        if folder.is_dir():
            for file in sorted(folder.glob("*.md")):
                found.setdefault(file.stem, file)
    return found


def load_skill(name: str, skills_dirs: Sequence[Path]) -> str:
    """The text of skill `name`.

    Raises:
        ToolError: No folder has `NAME.md`; the message lists the names there are.
    """
    skills = available_skills(skills_dirs)
    if name not in skills:
        known = ", ".join(sorted(skills)) or "none"
        raise ToolError(f"unknown skill {name!r} (available: {known})")
    return skills[name].read_text(encoding="utf-8")


def skill(ctx: ToolContext, name: str) -> ToolResult:
    """Load a skill: a playbook of instructions for a kind of task, e.g. 'planning'.

    Args:
        ctx: The run's workspace and limits.
        name: The skill's name.
    """
    return ToolResult(title=f"skill {name}", output=load_skill(name, ctx.skills_dirs))
