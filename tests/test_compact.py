"""Compaction by a side branch: a 200-turn conversation in a small context window.

The scripted model remembers nothing: it answers a check ("what is the code word for item
K?") only from what its request holds, and summarises (when asked by the compaction's side
branch) by keeping every fact line it is shown. So the checks pass only if the summaries
carry the facts forward; every request is measured against the window; a rewind to a
message inside a summarised range runs on the original messages.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any, Literal

import pytest

from fleet.conversation.roots import TaskSpec
from fleet.errors import ConversationError
from fleet.history import main_path
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.llm.config import FleetConfig, ModelConfig
from fleet.loop.compact import BRANCH, INSTRUCTION, compact_now
from fleet.loop.fit import estimate_tokens
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import MemoryStore, ScriptedModel, text

WINDOW = 6000
TURNS = 200
FACT = re.compile(r"item (\d+) is (W\d+)")
FILLER = " and some more words of small talk" * 12


def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Summarise every fact it is shown, answer a check from its request, else note it."""
    shown = " ".join(str(m.get("content") or "") for m in messages)
    last = str(messages[-1]["content"])
    if last == INSTRUCTION:
        facts = sorted(set(FACT.findall(shown)), key=lambda f: int(f[0]))
        return text("Facts: " + "; ".join(f"item {k} is {w}" for k, w in facts))
    asked = re.search(r"code word for item (\d+)\?", last)
    if asked:
        found = dict(FACT.findall(shown)).get(asked.group(1))
        return text(f"the code word is {found or 'unknown'}")
    return text("noted")


def small_fleet(
    tmp_path: Path,
    strategy: Literal["elide", "compact"] = "compact",
    store: TraceStore | None = None,
) -> tuple[InProcessFleet, ScriptedModel]:
    model = ScriptedModel(function=respond)
    alias = ModelConfig(
        provider="scripted", name="x", context_window=WINDOW, context_strategy=strategy
    )
    settings = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(
        settings, store or MemoryStore(), InProcessDispatcher(), clients={"small": model}
    )
    runtime = Runtime(**{**runtime.__dict__, "config": FleetConfig(models={"small": alias})})
    return InProcessFleet(runtime), model


def test_a_long_conversation_is_compacted_keeps_its_facts_and_fits_the_window(
    tmp_path: Path,
) -> None:
    fleet, model = small_fleet(tmp_path)
    root = fleet.run("Remember the facts I give you.", model="small", preset="explore")
    checks, right = 0, 0
    for turn in range(1, TURNS + 1):
        if turn % 10 == 0:
            item = turn // 2 - 1  # 4, 9, 14...: never a check turn, so always a fact
            done = fleet.continue_trace(root.trace_id, f"what is the code word for item {item}?")
            checks += 1
            right += done.answer == f"the code word is W{item}"
        else:
            fleet.continue_trace(root.trace_id, f"fact: item {turn} is W{turn}{FILLER}")
    sizes = [estimate_tokens(r, t) for r, t in zip(model.requests, model.tools_seen, strict=True)]
    store = fleet.store
    messages = store.messages(root.trace_id)
    summaries = [m for m in messages if m.metadata.get("compaction")]
    full = estimate_tokens(
        [
            {"role": m.role, "content": m.content}
            for m in messages
            if not m.metadata.get("branch")
            and not m.metadata.get("compaction")
            and "copied_from" not in m.metadata
        ],
        model.tools_seen[0],
    )
    print(
        f"\n{TURNS} turns, {len(summaries)} compactions; tokens per request: max {max(sizes)},"
        f" mean {statistics.mean(sizes):.0f} (window {WINDOW}); the whole history {full}"
    )
    assert right == checks == TURNS // 10, f"{right}/{checks} checks answered"
    assert len(summaries) >= 3
    assert max(sizes) < WINDOW, "every request, the side branches' too, stays in the window"
    assert full > 3 * WINDOW, "without compaction it would not have fitted"
    facts = [m for m in messages if m.role == "user" and "fact: item" in str(m.content)]
    assert len({m.content for m in facts}) == TURNS - TURNS // 10, "every original message kept"
    trace = store.get_trace(root.trace_id)
    path = main_path(messages, trace.head_sequence)
    assert not any(m.metadata.get("branch") == BRANCH for m in path), "side branches off the path"
    assert trace.run.context is not None and trace.run.context.compactions >= 1


def test_a_rewind_before_the_compaction_runs_on_the_original_messages(
    store: TraceStore, tmp_path: Path
) -> None:
    fleet, model = small_fleet(tmp_path, store=store)  # the Redis store's fenced writes too
    root = fleet.run("Remember the facts I give you.", model="small", preset="explore")
    for turn in range(1, 60):
        fleet.continue_trace(root.trace_id, f"fact: item {turn} is W{turn}{FILLER}")
    messages = fleet.store.messages(root.trace_id)
    (first, *_) = [m for m in messages if m.metadata.get("compaction")]
    summarised = first.metadata["compaction"]
    told = next(m for m in messages if str(m.content).startswith("fact: item 5 "))
    point = next(m for m in messages if m.parent_sequence == told.sequence)
    assert summarised["first"] < point.sequence < summarised["last"], "inside the summary"
    done = fleet.continue_trace(root.trace_id, "what is the code word for item 3?", point.sequence)
    assert done.answer == "the code word is W3"
    sent = model.requests[-1]
    assert not any("Summary of the conversation" in str(m.get("content")) for m in sent)
    assert any("fact: item 3 is W3" in str(m.get("content")) for m in sent), "the originals"


def test_fleet_compact_compacts_a_finished_root_and_refuses_a_short_one(tmp_path: Path) -> None:
    fleet, model = small_fleet(tmp_path, strategy="elide")  # nothing compacts on its own
    root = fleet.run("Remember the facts I give you.", model="small", preset="explore")
    with pytest.raises(ConversationError, match="too little to compact"):
        compact_now(fleet.runtime, root.trace_id)
    for turn in range(1, 8):
        fleet.continue_trace(root.trace_id, f"fact: item {turn} is W{turn}")
    before = fleet.store.messages(root.trace_id)
    done = compact_now(fleet.runtime, root.trace_id)
    assert done.summarised >= 4 and done.tokens_after < done.tokens_before
    after = fleet.store.messages(root.trace_id)
    assert {m.sequence for m in before} <= {m.sequence for m in after}, "nothing deleted"
    answer = fleet.continue_trace(root.trace_id, "what is the code word for item 2?").answer
    assert answer == "the code word is W2", "answered from the summary"
    assert "fact: item 2" not in str(model.requests[-1]), "the original message was not sent"


def test_compacting_a_running_or_a_sub_trace_is_refused(tmp_path: Path) -> None:
    fleet, _ = small_fleet(tmp_path)
    from fleet.conversation.roots import create_root

    queued = create_root(fleet.runtime, TaskSpec("later", "small", "explore"))
    with pytest.raises(ConversationError, match="finished root only"):
        compact_now(fleet.runtime, queued.trace_id)


def test_without_compaction_the_same_conversation_overflows(tmp_path: Path) -> None:
    """The control: `elide` has no tool output to cut here, so the window runs out."""
    fleet, _ = small_fleet(tmp_path, strategy="elide")
    root = fleet.run("Remember the facts I give you.", model="small", preset="explore")
    for turn in range(1, TURNS + 1):
        done = fleet.continue_trace(root.trace_id, f"fact: item {turn} is W{turn}{FILLER}")
        if done.status != "completed":
            break
    assert done.status == "failed" and "even with every tool output elided" in (done.error or "")
    print(f"\nwith elide only, the conversation failed at turn {turn} of {TURNS}")
    assert turn < TURNS // 4
