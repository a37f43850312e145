"""`send_message(to, text)`: agents of one tree write to each other, never to another tree."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet.conversation import messages
from fleet.conversation.between import SEND_MESSAGE, send_message
from fleet.conversation.roots import TaskSpec, create_root
from fleet.ids import child_id
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMClient, LLMResponse, ToolCall
from fleet.loop.toolcalls import tool_schemas
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.inbox_types import InboxEntry
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text

Request = list[dict[str, Any]]


def talking_runtime(store: TraceStore, workspace: Path, model: LLMClient) -> Runtime:
    """Explore branches may send messages (`messages: true` on the explore preset)."""
    settings = Settings(workspace=workspace, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": model})
    explore = replace(runtime.presets["explore"], messages=True)
    return replace(runtime, presets={**runtime.presets, "explore": explore})


def branches(runtime: Runtime, count: int) -> tuple[Trace, list[Trace]]:
    root = create_root(runtime, TaskSpec(task="root", model="test"))
    children = [
        Trace(
            trace_id=child_id(root.trace_id, "explore", i),
            root_trace_id=root.trace_id,
            parent_trace_id=root.trace_id,
            mode="explore",
            task=f"branch {i}",
            name=f"explore-{i:03d}",
            preset="explore",
            model="test",
        )
        for i in range(1, count + 1)
    ]
    runtime.store.create_traces(children)
    return root, children


def send_call(to: str, body: str = "hello") -> ToolCall:
    response = call(SEND_MESSAGE, to=to, text=body)
    return response.tool_calls[0]


def received(runtime: Runtime, trace: Trace) -> list[InboxEntry]:
    return messages.inbox(runtime).after(trace.trace_id, None, 100)


def test_a_branch_reaches_its_sibling_by_name_and_id_and_its_parent(
    store: TraceStore, tmp_path: Path
) -> None:
    runtime = talking_runtime(store, tmp_path, ScriptedModel())
    root, (one, two, _) = branches(runtime, 3)
    assert not send_message(runtime, one, send_call("explore-002")).is_error
    assert not send_message(runtime, one, send_call(two.trace_id, "by id")).is_error
    assert not send_message(runtime, one, send_call("parent", "to you")).is_error
    assert [e.posted.content for e in received(runtime, two)] == ["hello", "by id"]
    assert {e.posted.sender_trace_id for e in received(runtime, two)} == {one.trace_id}
    assert received(runtime, two)[0].posted.sender == "explore-001"
    assert [e.posted.content for e in received(runtime, root)] == ["to you"]
    assert SEND_MESSAGE in {t["function"]["name"] for t in tool_schemas(runtime, one)}


def test_another_tree_a_forged_id_and_itself_are_refused(store: TraceStore, tmp_path: Path) -> None:
    runtime = talking_runtime(store, tmp_path, ScriptedModel())
    _, (one, _) = branches(runtime, 2)
    other_root, (theirs, _) = branches(runtime, 2)
    forged = child_id(one.root_trace_id, "explore", 9)  # of my tree, but no such trace
    for to in (theirs.trace_id, other_root.trace_id, forged, one.trace_id, "explore-009", "../x"):
        result = send_message(runtime, one, send_call(to))
        assert result.is_error, to
        assert "\n" not in result.output
    assert received(runtime, theirs) == [] and received(runtime, other_root) == []


def test_a_preset_that_does_not_opt_in_cannot_send(store: TraceStore, tmp_path: Path) -> None:
    runtime = talking_runtime(store, tmp_path, ScriptedModel())
    root, (one, _) = branches(runtime, 2)
    result = send_message(runtime, root, send_call("explore-001"))  # `default`: no messages
    assert result.is_error and "not allowed" in result.output
    assert SEND_MESSAGE not in {t["function"]["name"] for t in tool_schemas(runtime, root)}
    assert received(runtime, one) == []


def test_fan_out_is_capped_per_minute_and_by_size(store: TraceStore, tmp_path: Path) -> None:
    runtime = talking_runtime(store, tmp_path, ScriptedModel())
    _, (one, two, three) = branches(runtime, 3)
    cap = messages.LIMITS.sends_per_minute
    for i in range(cap):
        to = "explore-002" if i % 2 else "explore-003"
        assert not send_message(runtime, one, send_call(to, f"m{i}")).is_error
    over = send_message(runtime, one, send_call("explore-002", "one more"))
    assert over.is_error and f"at most {cap} messages per minute" in over.output
    big = send_message(runtime, two, send_call("explore-001", "x" * 5000))
    assert big.is_error
    assert len(received(runtime, two)) + len(received(runtime, three)) == cap
    assert received(runtime, one) == []


class Unlocked:
    """A model function called as it is: `ScriptedModel` runs its function under a lock,
    so a branch waiting inside its call would hold every other branch's call back."""

    def __init__(self, function: Callable[[Request, Request], LLMResponse]) -> None:
        self.function = function

    def complete(
        self,
        messages: Request,
        tools: Request,
        *,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        cache_key: str | None = None,
    ) -> LLMResponse:
        """`function(messages, tools)`, in the caller's thread, beside other calls."""
        return self.function(messages, tools)


def test_in_a_live_explore_branch_one_tells_branch_two(store: TraceStore, tmp_path: Path) -> None:
    """Branch 2 waits (in its first model call) until the message is in; its next request
    carries the `## Messages` block and `check_messages` gives the text."""
    seen: dict[str, list[list[dict[str, Any]]]] = {}

    def model_fn(request: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = str([m for m in request if m["role"] == "user"][0]["content"])
        turn = len(seen.setdefault(task, []))
        seen[task].append(request)
        if task == "root":
            return call("agent", task=["one", "two"]) if turn == 0 else text("root done")
        if task == "one":
            return (
                call(SEND_MESSAGE, to="explore-002", text="B is a dead end")
                if turn == 0
                else text("1")
            )
        if turn == 0:  # until branch one's message is in branch two's inbox
            # This run's branch two: the module's tests share the store, ended ones stay.
            two = next(t for t in store.list_traces(50) if t.task == "two" and not t.is_terminal)
            deadline = time.monotonic() + 10
            while not messages.inbox(runtime).count(two.trace_id) and time.monotonic() < deadline:
                time.sleep(0.01)
            return call("glob", pattern="*")
        if turn == 1:
            return call(messages.CHECK_MESSAGES)
        return text("2")

    runtime = talking_runtime(store, tmp_path, Unlocked(model_fn))
    done = InProcessFleet(runtime).run("root", model="test")
    assert done.status == "completed"
    blocks = [u for u in _users(seen["two"][1]) if "## Messages" in u]
    assert blocks and '"explore-001"' in blocks[0]
    result = [m for m in seen["two"][2] if m["role"] == "tool"][-1]
    assert '"B is a dead end"' in str(result["content"])
    assert not any("## Messages" in u for r in seen["one"] for u in _users(r))


def _users(request: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in request if m["role"] == "user"]


@pytest.mark.parametrize("to", ["", "   "])
def test_an_empty_recipient_is_refused(store: TraceStore, tmp_path: Path, to: str) -> None:
    runtime = talking_runtime(store, tmp_path, ScriptedModel())
    _, (one, _) = branches(runtime, 2)
    assert send_message(runtime, one, send_call(to)).is_error
