"""Cross-cutting concerns as hooks with typed no-op methods (metrics, tracing, cost, policy).

The runner calls them around each run, model call and tool call; `fleet.observe.otel` turns them
into OpenTelemetry spans. An operator's hooks (`FLEET_HOOKS`, `fleet.observe.operator`) run
guarded: one that raises or overruns its timeout is logged and skipped. Two events may
block by raising `fleet.HookBlocked`: `tool_started` (the call is refused) and
`model_requested` (the trace ends `stopped`, `stop_reason: "hook"`).
"""

from __future__ import annotations

from typing import Any

from fleet.goals import Goal
from fleet.llm.base import LLMResponse, ToolCall
from fleet.models import Trace
from fleet.tools.base import ToolResult


class Hooks:
    """Subclass and override what you need; every method is a no-op here."""

    def listens(self, event: str) -> bool:
        """Whether this hook does anything on `event` (its method is not the no-op here).

        A caller may skip an event nobody listens to (`fleet.loop.call.Prepared`).
        """
        method = getattr(self, event)
        return getattr(method, "__func__", None) is not getattr(Hooks, event)

    def run_started(self, trace: Trace) -> None:
        """A runner took the trace: its first run, a resume, or a redelivery."""

    def run_ended(self, trace: Trace, outcome: str, error: BaseException | None = None) -> None:
        """That run let go (`outcome` as in `RunResult`, or `crashed` with the `error`)."""

    def turn_started(self, trace: Trace, iteration: int) -> None:
        """Before each model call."""

    def turn_ended(self, trace: Trace, iteration: int) -> None:
        """After a turn's tool calls were written (a final answer's turn ends the run)."""

    def model_requested(self, trace: Trace, model: str, messages: list[dict[str, Any]]) -> None:
        """Right before the model call, with the model's name and the messages sent.

        Raise `fleet.HookBlocked(reason)` to end the trace instead (`stop_reason: "hook"`).
        """

    def model_responded(self, trace: Trace, response: LLMResponse) -> None:
        """After each model call, with its usage."""

    def model_failed(self, trace: Trace, error: BaseException) -> None:
        """The model call raised (after the client's own retries)."""

    def tool_started(self, trace: Trace, call: ToolCall) -> None:
        """Before a tool call of the model's turn runs (sub-agent calls included).

        Raise `fleet.HookBlocked(reason)` to refuse it: nothing runs and the model reads
        the reason as the call's result.
        """

    def tool_finished(self, trace: Trace, call: ToolCall, result: ToolResult | None) -> None:
        """After each tool call, refused ones included.

        `result` is None for an `agent`/`evaluate` call handed to sub-agents: its result
        arrives when they are collected, in another run.
        """

    def goal_completed(self, trace: Trace, goal: Goal) -> None:
        """A goal of the trace's plan was marked done (a plan step completed)."""

    def child_spawned(self, parent: Trace, child: Trace) -> None:
        """A sub-agent was handed to the dispatcher for one of the parent's tool calls."""

    def child_settled(self, parent_trace_id: str, child: Trace) -> None:
        """An ended child was collected into its parent (once per child)."""

    def messages_delivered(self, trace: Trace, messages: list[dict[str, Any]]) -> None:
        """Messages sent to the trace reached its conversation in full.

        By `check_messages`, or an interrupting one at the next call; each `{entry_id, from,
        from_trace_id, conversation_id, content}` (`fleet.conversation.messages`).
        """

    def context_lines(self, trace: Trace) -> list[str]:
        """Lines added to the periodic injection (plan and collaborators, every N turns)."""
        return []

    def child_context(self, parent: Trace, tool_call_id: str) -> dict[str, str]:
        """Propagation fields for a child that this tool call spawns, kept on the child.

        Stored as the child's `run.otel`, so a run of the child on any machine,
        redelivered or resumed, continues its parent's distributed trace.
        """
        return {}

    def run_finished(self, trace: Trace) -> None:
        """When a run ends in a terminal status."""

    def flush(self) -> None:
        """Before the process exits: send whatever is buffered."""


NO_HOOKS = Hooks()
