"""The goal plan: a small tree of goals the model manages with the `goal` tool."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.errors import ToolError

GoalStatus = Literal["pending", "in_progress", "done", "abandoned"]


class Goal(BaseModel):
    """One step of the plan (stored in its trace: fields a newer release added are kept)."""

    model_config = ConfigDict(extra="allow")

    id: str
    description: str
    parent_id: str | None = None
    status: GoalStatus = "pending"
    summary: str = ""
    sub_trace_ids: list[str] = Field(default_factory=list)
    """The sub-agents (delegate, explore, evaluate traces) that worked on this goal."""


class GoalTree(BaseModel):
    """An ordered goal tree with one focused goal."""

    model_config = ConfigDict(extra="allow")

    goals: list[Goal] = Field(default_factory=list)
    focus_id: str | None = None

    def get(self, goal_id: str) -> Goal:
        """The goal with this id, or `ToolError`."""
        for goal in self.goals:
            if goal.id == goal_id:
                return goal
        raise ToolError(f"no goal {goal_id!r}")

    def _next_id(self, parent_id: str | None) -> str:
        siblings = [g for g in self.goals if g.parent_id == parent_id]
        prefix = f"{parent_id}." if parent_id else ""
        return f"{prefix}{len(siblings) + 1}"

    def add(self, description: str, *, under: str | None = None, after: str | None = None) -> Goal:
        """Add a goal at the top level, under a parent, or right after a sibling."""
        parent_id = under
        index = len(self.goals)
        if after is not None:
            sibling = self.get(after)
            parent_id = sibling.parent_id
            index = self.goals.index(sibling) + 1
        elif under is not None:
            self.get(under)
        goal = Goal(id=self._next_id(parent_id), description=description, parent_id=parent_id)
        self.goals.insert(index, goal)
        if self.focus_id is None:
            self.focus(goal.id)
        return goal

    def focus(self, goal_id: str) -> Goal:
        """Make this goal the one being worked on."""
        goal = self.get(goal_id)
        self.focus_id = goal.id
        if goal.status == "pending":
            goal.status = "in_progress"
        return goal

    def done(self, goal_id: str, summary: str = "") -> Goal:
        """Mark a goal done and move focus to the next pending one."""
        return self._finish(goal_id, "done", summary)

    def abandon(self, goal_id: str, reason: str = "") -> Goal:
        """Mark a goal abandoned and move focus on."""
        return self._finish(goal_id, "abandoned", reason)

    def _finish(self, goal_id: str, status: GoalStatus, summary: str) -> Goal:
        goal = self.get(goal_id)
        goal.status = status
        goal.summary = summary
        if self.focus_id == goal_id:
            pending = [g for g in self.goals if g.status == "pending"]
            self.focus_id = pending[0].id if pending else None
            if pending:
                pending[0].status = "in_progress"
        return goal

    def link(self, goal_id: str, sub_trace_ids: list[str]) -> Goal:
        """Record that these sub-traces worked on the goal (each id once, in order)."""
        goal = self.get(goal_id)
        goal.sub_trace_ids += [t for t in sub_trace_ids if t not in goal.sub_trace_ids]
        return goal

    def render(self) -> str:
        """The plan as Markdown, for injection into the context."""
        if not self.goals:
            return ""
        marks = {"pending": " ", "in_progress": ">", "done": "x", "abandoned": "-"}
        lines = ["## Plan"]
        for goal in self.goals:
            indent = "  " * goal.id.count(".")
            focus = " (focus)" if goal.id == self.focus_id else ""
            tail = f" — {goal.summary}" if goal.summary else ""
            if goal.sub_trace_ids:  # the latest few: enough to `continue_from` one
                tail += f" [sub-traces: {', '.join(goal.sub_trace_ids[-3:])}]"
            mark = marks[goal.status]
            lines.append(f"{indent}- [{mark}] {goal.id} {goal.description}{focus}{tail}")
        return "\n".join(lines)


GOAL_TOOL_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["add", "focus", "done", "abandon", "show"]},
        "description": {"type": "string", "description": "For add: what the goal is."},
        "goal_id": {"type": "string", "description": "For focus/done/abandon."},
        "under": {"type": "string", "description": "For add: parent goal id."},
        "after": {"type": "string", "description": "For add: sibling goal id to follow."},
        "summary": {"type": "string", "description": "For done/abandon: outcome or reason."},
    },
    "required": ["action"],
}


def apply_goal_action(tree: GoalTree, args: dict[str, object]) -> str:
    """Run one `goal` tool call against the tree and say what happened."""
    action = args.get("action")

    def text(key: str) -> str | None:
        value = args.get(key)
        return None if value is None else str(value)

    match action:
        case "add":
            description = text("description")
            if not description:
                raise ToolError("goal add needs a description")
            goal = tree.add(description, under=text("under"), after=text("after"))
            return f"added goal {goal.id}\n{tree.render()}"
        case "focus" | "done" | "abandon":
            goal_id = text("goal_id")
            if not goal_id:
                raise ToolError(f"goal {action} needs a goal_id")
            if action == "focus":
                tree.focus(goal_id)
            elif action == "done":
                tree.done(goal_id, text("summary") or "")
            else:
                tree.abandon(goal_id, text("summary") or "")
            return tree.render()
        case "show":
            return tree.render() or "(no goals yet)"
        case _:
            raise ToolError(f"unknown goal action {action!r}")
