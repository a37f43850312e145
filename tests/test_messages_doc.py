"""docs/messages.md's example is what a run of the fleet gives, byte for byte (trace ids aside).

The seed's A2A IM example: a `## Messages` block beside the plan and `## Active
Collaborators`, then the `check_messages` result. The run the page describes: in process,
`inject_every_turns=3`, a goal, a delegate that answered, a message from `code-reviewer`
sent during the root's third call.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fleet.conversation.messages import CHECK_MESSAGES, send
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.testing import ScriptedModel, call, text

PAGE = Path(__file__).resolve().parent.parent / "docs" / "messages.md"
INTRO = "The block as a run of the fleet shows it"
SUB_TRACE = re.compile(r"\S+@delegate-\d{14}-\d{3}")
NOTE = "Please look at parser.py first: the bug is in tokenize()\nDetails follow."


def shown_on_the_page() -> tuple[str, str]:
    """The page's two fenced blocks after INTRO: the injection, the `check_messages` result."""
    after = PAGE.read_text().split(INTRO, 1)[1]
    blocks = re.findall(r"```\n(.*?)\n```", after, flags=re.DOTALL)
    return blocks[0], blocks[1]


class Reviewer:
    """The root's model: a goal, a delegate, a call during which the message lands, a read."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime, self.turn = runtime, 0

    def __call__(self, request: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = next(m for m in request if m["role"] == "user")["content"]
        if task == "Compare plan A and plan B":
            return text("plan A is best")
        self.turn += 1
        if self.turn == 1:
            return call("goal", action="add", description="Analyse the code architecture")
        if self.turn == 2:
            return call("agent", task="Compare plan A and plan B")
        if self.turn == 3:
            root = next(t for t in self.runtime.store.list_traces() if t.parent_trace_id is None)
            send(
                self.runtime,
                root.trace_id,
                NOTE,
                sender="code-reviewer",
                conversation_id="review-42",
            )
            return call("glob", pattern="*.py")
        if self.turn == 4:
            return call(CHECK_MESSAGES)
        return text("done")


def test_the_pages_example_is_the_fleets_real_output(tmp_path: Path) -> None:
    model = ScriptedModel()
    settings = Settings(workspace=tmp_path, env={}, inject_every_turns=3)
    runtime = Runtime.build(settings, MemoryStore(), InProcessDispatcher(), clients={"t": model})
    model._function = Reviewer(runtime)
    assert InProcessFleet(runtime).run("Review the code", model="t").status == "completed"
    sent = [m for request in model.requests for m in request]
    [injected] = {str(m["content"]) for m in sent if "## Messages" in str(m["content"])}
    [result] = {
        str(m["content"])
        for m in sent
        if m["role"] == "tool" and "1 message (" in str(m["content"])
    }
    block, read = shown_on_the_page()
    assert SUB_TRACE.sub("SUB", injected) == SUB_TRACE.sub("SUB", block)
    assert result == read
