"""Cross-cutting concerns as hooks with typed no-op methods (metrics, tracing, cost)."""

from __future__ import annotations

from fleet.llm.base import LLMResponse
from fleet.models import Trace
from fleet.tools.base import ToolResult


class Hooks:
    """Subclass and override what you need; every method is a no-op here."""

    def turn_started(self, trace: Trace, iteration: int) -> None:
        """Before each model call."""

    def model_responded(self, trace: Trace, response: LLMResponse) -> None:
        """After each model call, with its usage."""

    def tool_finished(self, trace: Trace, name: str, result: ToolResult) -> None:
        """After each tool call, refused ones included."""

    def run_finished(self, trace: Trace) -> None:
        """When a run ends in a terminal status."""


NO_HOOKS = Hooks()
