"""What the loop does next: a pure function of the model's response, and what it waits on.

`decide_next` turns a response into `Finish | CallTools | DoomLoop`; the waits a run can
end in (a person's answer or approval, a provider batch, spawned sub-agents, a remote
child's A2A task) are steps too, so the runner `match`es every way a run goes on or ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from fleet.llm.base import LLMResponse, ToolCall


@dataclass(frozen=True)
class Finish:
    """The model gave a final answer."""

    answer: str
    reason: str = "final_answer"
    """The `stop_reason` recorded: `budget` for the root's set-aside last turn."""
    kind: Literal["finish"] = "finish"


@dataclass(frozen=True)
class CallTools:
    """The model asked for tool calls (sub-agents included)."""

    calls: tuple[ToolCall, ...]
    kind: Literal["call_tools"] = "call_tools"


@dataclass(frozen=True)
class DoomLoop:
    """The same tool with the same arguments was asked for too many times in a row."""

    call: ToolCall
    repeats: int
    kind: Literal["doom_loop"] = "doom_loop"


@dataclass(frozen=True)
class OnPerson:
    """A person was asked (`ask_human`); the run ends, no slot held, `fleet reply` resumes."""

    tool_call_id: str
    kind: Literal["on_person"] = "on_person"


@dataclass(frozen=True)
class OnApproval:
    """A call waits for a person's approval; `fleet approve`/`deny` resumes the trace."""

    tool_call_id: str
    kind: Literal["on_approval"] = "on_approval"


@dataclass(frozen=True)
class OnBatch:
    """The turn's model call is parked in a provider batch; the poller resumes the trace."""

    custom_id: str
    kind: Literal["on_batch"] = "on_batch"


@dataclass(frozen=True)
class OnChildren:
    """Sub-agents of these calls still run; their collect resumes the trace."""

    tool_call_ids: tuple[str, ...]
    kind: Literal["on_children"] = "on_children"


@dataclass(frozen=True)
class OnRemote:
    """A remote child (`fleet.remote`) waits on its A2A task, or on a person it asked.

    A poller of the watch list, or the person's `fleet reply`, sends the child again.
    """

    agent: str
    """The `remote_agents` name the task runs on."""
    task_id: str | None
    kind: Literal["on_remote"] = "on_remote"


Decision = Finish | CallTools | DoomLoop
"""What a model's response decides (`decide_next`)."""
Waiting = OnPerson | OnApproval | OnBatch | OnChildren | OnRemote
"""What a run ends waiting on: the trace is `waiting`, and something else resumes it."""
Step = Decision | Waiting


def decide_next(
    response: LLMResponse, previous_calls: list[tuple[str, str]], repeats: int = 3
) -> Decision:
    """Finish, call tools, or stop a doom loop.

    Args:
        response: The model's answer this turn.
        previous_calls: The most recent earlier tool calls as (name, arguments), oldest first.
        repeats: How many identical calls in a row make a doom loop.
    """
    if not response.tool_calls:
        return Finish(response.content or "")
    current = [(c.name, c.arguments) for c in response.tool_calls]
    tail = (previous_calls + current)[-repeats:]
    # Arguments are compared (parsed and encoded again) only for a full run of one name.
    if len(tail) == repeats and len({n for n, _ in tail}) == 1:
        if len({_canonical(a) for _, a in tail}) == 1:
            return DoomLoop(response.tool_calls[-1], repeats)
    return CallTools(response.tool_calls)


def _canonical(arguments: str) -> str:
    """Arguments compared by meaning, so whitespace or key order cannot hide a loop."""
    try:
        return json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    except ValueError:
        return arguments
