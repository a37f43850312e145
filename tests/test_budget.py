"""Tree budgets: the Lua and its memory twin, and a whole tree stopping at its budget.

Every budget test runs on each store's budgets (`store.capability(LIMITS)`): the memory twin,
the Lua on fakeredis, and the Lua on a real Redis (integration tier).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet import lifecycle
from fleet.batch.file import parse_entry
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.limits.budget import Budget, Exhausted, Reserved
from fleet.limits.capability import LIMITS
from fleet.limits.gate import FINAL_NOTE
from fleet.limits.protocols import TreeBudgets
from fleet.llm.base import LLMResponse, ToolCall, Usage
from fleet.loop.runner import Runner, run_to_end
from fleet.models import Message, Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, text

ROOT = "root"


@pytest.fixture
def budgets(store: TraceStore) -> TreeBudgets:
    return store.capability(LIMITS).budgets


def test_calls_reserve_until_the_budget_and_the_root_keeps_a_final_turn(
    budgets: TreeBudgets,
) -> None:
    budgets.create(ROOT, Budget(tokens=1000))  # 100 set aside for the root's last turn
    assert budgets.reserve("a", ROOT, 300, 0.0) == Reserved()
    assert budgets.reserve("b", ROOT, 300, 0.0) == Reserved()
    assert budgets.reserve("c", ROOT, 300, 0.0) == Reserved()  # 900 + 100 final: full
    assert budgets.reserve("d", ROOT, 1, 0.0) == Exhausted("tokens")
    assert budgets.reserve("a", ROOT, 1, 0.0) == Exhausted("tokens"), "spent for everyone"
    assert budgets.reserve(ROOT, ROOT, 5000, 0.0) == Reserved(final=True)
    budgets.settle(ROOT, ROOT, 40, 0.0)
    assert budgets.reserve(ROOT, ROOT, 1, 0.0) == Exhausted("tokens"), "one final turn only"
    state = budgets.state(ROOT)
    assert state is not None and state.exhausted == "tokens"
    # In flight: b and c. A trace asking again gives up its earlier reservation (a), and
    # the final turn is no longer set aside.
    assert state.reserved_tokens == 300 + 300


def test_a_root_run_again_during_its_final_turn_gets_that_turn_again(
    budgets: TreeBudgets,
) -> None:
    # make chaos seed 40 round 15: a worker froze on the root's final turn past its lease;
    # the recovered run asked again, was refused ("one final turn only"), and the root
    # ended `completed` with no answer at all (the frozen call, thawed, was fenced out).
    budgets.create(ROOT, Budget(tokens=1000))
    assert budgets.reserve(ROOT, ROOT, 5000, 0.0) == Reserved(final=True)  # then lost
    assert budgets.reserve(ROOT, ROOT, 5000, 0.0) == Reserved(final=True), "its own turn"
    state = budgets.state(ROOT)
    assert state is not None and state.reserved_tokens == 100, "held once, not twice"
    budgets.settle(ROOT, ROOT, 40, 0.0)
    assert budgets.reserve(ROOT, ROOT, 1, 0.0) == Exhausted("tokens"), "and then no more"
    assert budgets.reserve("a", ROOT, 1, 0.0) == Exhausted("tokens"), "a branch gets none"


def test_settling_replaces_the_reservation_with_real_usage(budgets: TreeBudgets) -> None:
    budgets.create(ROOT, Budget(tokens=10_000, usd=1.0))
    budgets.reserve("a", ROOT, 4000, 0.2)
    state = budgets.state(ROOT)
    assert state is not None
    assert (state.used_tokens, state.reserved_tokens) == (0, 4000 + 1000)
    budgets.settle("a", ROOT, 1234, 0.05)
    state = budgets.state(ROOT)
    assert state is not None
    assert (state.used_tokens, state.reserved_tokens) == (1234, 1000)
    assert state.used_usd == pytest.approx(0.05)
    assert state.to_json()["limit"]["tokens"] == 10_000


def test_a_rerun_after_a_crash_replaces_its_own_reservation(budgets: TreeBudgets) -> None:
    budgets.create(ROOT, Budget(tokens=1000))
    budgets.reserve("a", ROOT, 800, 0.0)  # the worker died during this call
    assert budgets.reserve("a", ROOT, 800, 0.0) == Reserved(), "not counted twice"


def test_usd_and_wall_time_end_a_tree_too(
    budgets: TreeBudgets, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets.create("r1", Budget(usd=1.0))
    assert budgets.reserve("a", "r1", 10, 0.85) == Reserved()
    assert budgets.reserve("b", "r1", 10, 0.1) == Exhausted("usd")
    with monkeypatch.context() as then:
        then.setattr("fleet.limits.budget.now_ms", lambda: 1)  # created long ago
        budgets.create("r2", Budget(wall_s=60))
    assert budgets.reserve("a", "r2", 10, 0.0) == Exhausted("wall_s")


def test_sub_agents_and_depth_are_counted_at_spawn(budgets: TreeBudgets) -> None:
    budgets.create(ROOT, Budget(sub_agents=5, depth=1))
    assert budgets.spawn(ROOT, 3, depth=1) is None
    refusal = budgets.spawn(ROOT, 3, depth=1)
    assert refusal is not None and "2 more sub-agent" in refusal
    assert budgets.spawn(ROOT, 2, depth=1) is None
    deeper = budgets.spawn(ROOT, 1, depth=2)
    assert deeper is not None and "depth" in deeper


def test_a_tree_without_budget_costs_no_reservation(
    budgets: TreeBudgets, store: TraceStore
) -> None:
    assert budgets.reserve("a", "free", 10**9, 10**6) == Reserved(budgeted=False)
    assert budgets.state("free") is None and budgets.spawn("free", 10**6, 99) is None
    if isinstance(store, RedisStore):
        assert not store.client.exists(keys.budget("free"), keys.budget_held("free"))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"tokens": -1}, "'budget.tokens': input should be greater than 0"),
        ({"tokens": "many"}, "'budget.tokens': input should be a valid integer"),
        ({"dollars": 3}, "unknown key 'budget.dollars'"),
        ([1, 2], "'budget': input should be a valid dictionary"),
    ],
)
def test_bad_budgets_name_the_field(data: object, problem: str) -> None:
    # A batch entry's `budget:` is where a budget is parsed from text.
    with pytest.raises(ValueError, match=problem):
        parse_entry({"task": "t", "budget": data}, 3)


BRANCHES, BRANCH_TOKENS, BUDGET_TOKENS = 20, 4_500, 40_000


def tree_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """The root explores 20 branches, then sums up; each branch answers with a large usage."""
    task = next(str(m["content"]) for m in messages if m["role"] == "user")
    turn = sum(1 for m in messages if m["role"] == "assistant")
    prompt = len(json.dumps(messages)) // 4
    if task.startswith("Branch"):
        usage = Usage(prompt_tokens=prompt, completion_tokens=BRANCH_TOKENS - prompt)
        return LLMResponse(content=f"found: {task}", usage=usage)
    if turn == 0:
        tasks = [f"Branch {i}" for i in range(1, BRANCHES + 1)]
        call = ToolCall("call_1", "agent", json.dumps({"task": tasks}))
        return LLMResponse(content=None, tool_calls=(call,), usage=Usage(prompt, 50))
    last_tool = next(str(m["content"]) for m in reversed(messages) if m["role"] == "tool")
    return LLMResponse(content=f"summary of what came back:\n{last_tool}", usage=Usage(prompt, 200))


def test_a_tree_stops_at_its_budget_and_answers_from_what_it_has(
    store: TraceStore, tmp_path: Path
) -> None:
    settings = Settings(workspace=tmp_path)
    model = ScriptedModel(function=tree_model)
    local = InProcessFleet.from_settings(settings, store=store, clients={"m": model})
    spec = TaskSpec("survey", model="m", budget=Budget(tokens=BUDGET_TOKENS))
    root = create_root(local.runtime, spec)
    run_to_end(Runner(local.runtime), root.trace_id)
    store = local.store
    trace = store.get_trace(root.trace_id)
    assert trace.status == "completed", trace.error
    assert trace.run.stop_reason == "budget"
    branches = [store.get_trace(c) for c in store.children(root.trace_id)]
    spent = sum(t.stats.prompt_tokens + t.stats.completion_tokens for t in [trace, *branches])
    state = local.runtime.gate.budgets.state(root.trace_id)  # type: ignore[union-attr]
    assert state is not None and state.used_tokens == spent
    # The documented bound: the input estimate books one token per 3 characters, which is
    # more than this model counts (1 per 4), and answers stay under the booked 4096, so
    # only the root's final turn can go past its set-aside.
    assert spent <= BUDGET_TOKENS + trace.stats.completion_tokens, (spent, BUDGET_TOKENS)
    done = [b for b in branches if b.status == "completed"]
    cut = [b for b in branches if b.status == "stopped"]
    assert len(done) + len(cut) == BRANCHES and done and cut
    assert all(b.run.stop_reason == "budget" for b in cut)
    for branch in done:
        assert f"found: {branch.task}" in (trace.answer or "")
    entries = {c.trace_id: c for c in store.collaborators(root.trace_id)}
    for branch in cut:
        assert entries[branch.trace_id].status == "stopped"
        assert "cut by the tree's budget (tokens)" in entries[branch.trace_id].summary
    final_note = [m for m in store.messages(root.trace_id) if m.role == "user"][-1]
    assert "budget of this task is used up" in (final_note.content or "")


def test_the_in_process_fleet_keeps_budgets_in_memory(tmp_path: Path) -> None:
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), clients={"m": ScriptedModel()}
    )
    root = create_root(local.runtime, TaskSpec("t", model="m", budget=Budget(tokens=10_000)))
    state = local.store.capability(LIMITS).budgets.state(root.trace_id)
    assert state is not None and state.limit.tokens == 10_000 and state.reserved_tokens == 1000
    # A second runtime on the same store (another "process") sees the same budget.
    other = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), store=local.store, clients={"m": ScriptedModel()}
    )
    assert other.runtime.gate.budgets is local.runtime.gate.budgets


def test_a_tiny_budget_is_refused_in_process_too(tmp_path: Path) -> None:
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), clients={"m": ScriptedModel()}
    )
    with pytest.raises(ConfigError, match="budget tokens 1 cannot pay for one call"):
        create_root(local.runtime, TaskSpec("t", model="m", budget=Budget(tokens=1)))
    assert local.store.list_traces() == []


def test_trace_show_has_the_budget_limit_used_and_reserved(
    redis_db: redis.Redis, tmp_path: Path
) -> None:
    from fleetops.cli.output import render_tree, trace_object

    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), store=RedisStore(redis_db), clients={"m": ScriptedModel()}
    )
    root = create_root(local.runtime, TaskSpec("t", model="m", budget=Budget(tokens=10_000)))
    shown = trace_object(local.store, root)["budget"]
    assert shown["limit"]["tokens"] == 10_000
    assert shown["used"] == {"tokens": 0, "usd": 0.0, "sub_agents": 0}
    assert shown["reserved"]["tokens"] == 1000  # the root's final turn, set aside
    assert "budget: 0/10000 tokens (+1000 reserved)" in "\n".join(render_tree(local.store, root))


def test_a_budget_smaller_than_one_call_is_refused_before_anything_is_written(
    redis_db: redis.Redis, tmp_path: Path
) -> None:
    """One call books its longest answer (4096 by default) and a tenth is kept for the end."""
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), store=RedisStore(redis_db), clients={"m": ScriptedModel()}
    )
    before = set(redis_db.scan_iter())

    with pytest.raises(ConfigError) as refused:
        create_root(local.runtime, TaskSpec("t", model="m", budget=Budget(tokens=4551)))

    message = str(refused.value)
    assert "budget tokens 4551" in message and "4552" in message and "\n" not in message
    assert set(redis_db.scan_iter()) == before  # no root, no budget hash
    fits = create_root(local.runtime, TaskSpec("t", model="m", budget=Budget(tokens=4552)))
    assert local.store.get_trace(fits.trace_id).status == "queued"


def test_a_batch_line_whose_budget_cannot_pay_for_one_call_is_named(tmp_path: Path) -> None:
    from fleet.batch.file import BatchInputError, build_entries, check_entries

    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), clients={"m": ScriptedModel()}
    )
    tiny = {"task": "x", "model": "m", "budget": {"tokens": 9}}
    lines = [(1, {"task": "ok", "model": "m"}), (2, {"task": "t", "model": "m"}), (3, tiny)]
    entries = build_entries(lines, "b")

    with pytest.raises(BatchInputError, match=r"^b:3: budget tokens 9 cannot pay for one call"):
        check_entries(local.runtime, entries, "b")


def test_a_batch_entry_carries_its_budget() -> None:
    from fleet.batch.file import BatchInputError, build_entries
    from fleet.batch.run import BatchResult
    from fleetops.cli.batch import budget_text

    (entry,) = build_entries([(1, {"task": "t", "budget": {"tokens": 500, "usd": 0.5}})], "b")
    assert entry.budget == Budget(tokens=500, usd=0.5)
    with pytest.raises(BatchInputError, match="b:1:"):
        build_entries([(1, {"task": "t", "budget": {"tokens": -5}})], "b")
    spent = {"limit": {"tokens": 500}, "used": {"tokens": 480}, "exhausted": "tokens"}
    result = BatchResult("e", "tid", "completed", budget=spent)
    assert budget_text(result) == "  budget 480/500 tok (ran out: tokens)"
    assert result.to_json()["budget"] == spent


def test_the_memory_budgets_decide_as_the_lua_does_call_for_call() -> None:
    """One seeded random history of reserve/settle/spawn on both: every answer the same.

    The history goes through reservations, refused spawns (width and depth), the tree
    running out of tokens and the root's final turn (seed 22: 181, 52, 22 and 1 of them).
    """
    import random

    from fleet.limits.backends.memory.trees import MemoryBudgets
    from fleet.limits.backends.redis.budgets import Budgets
    from tests.conftest import fake_redis

    rng = random.Random(22)
    lua, memory = Budgets(fake_redis()), MemoryBudgets()
    for side in (lua, memory):
        side.create("r", Budget(tokens=200_000, usd=2.0, sub_agents=12, depth=2))
    traces = ["r", "r@a", "r@b", "r@c", "r@a@x"]
    for _ in range(400):
        trace, op = rng.choice(traces), rng.random()
        if op < 0.5:
            est, usd = rng.randint(1, 3000), round(rng.random() * 0.02, 4)
            answers: list[object] = [side.reserve(trace, "r", est, usd) for side in (lua, memory)]
        elif op < 0.85:
            used, usd = rng.randint(0, 3000), round(rng.random() * 0.02, 4)
            final = rng.random() < 0.2
            for side in (lua, memory):
                side.settle(trace, "r", used, usd, final_refund=final)
            answers = [lua.state("r"), memory.state("r")]
        else:
            children, depth = rng.randint(1, 4), rng.randint(1, 3)
            answers = [side.spawn("r", children, depth) for side in (lua, memory)]
        assert answers[0] == answers[1], (op, trace, answers)


def test_an_ended_tree_holds_nothing_and_a_continued_root_gets_its_last_turn_again(
    store: TraceStore, tmp_path: Path
) -> None:
    # Chaos seed 39 round 0: a budget tree stopped around a Sentinel failover ended with its
    # root's set-aside (a tenth of the tokens) still reserved; a call whose settle was lost
    # to a failed write, then a stop, would leave its reservation too.
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), store=store, clients={"m": ScriptedModel()}
    )
    runtime = local.runtime
    root = create_root(runtime, TaskSpec("t", model="m", budget=Budget(tokens=10_000)))
    budgets = runtime.gate.budgets
    assert budgets is not None
    assert budgets.reserve(root.trace_id, root.trace_id, 4000, 0.0) == Reserved()  # never settled
    lifecycle.stop_subtree(runtime, root.trace_id)  # queued: ended `stopped` here
    state = budgets.state(root.trace_id)
    assert state is not None and state.reserved_tokens == 0, state
    lifecycle.stop_subtree(runtime, root.trace_id)  # released once: nothing more to give back
    again = budgets.state(root.trace_id)
    assert again is not None and (again.reserved_tokens, again.used_tokens) == (0, 0)
    ended = store.get_trace(root.trace_id)
    lifecycle.reopen_root(runtime, ended, 1, {"turn": 1})
    state = budgets.state(root.trace_id)
    assert state is not None and state.reserved_tokens == 1000, "the set-aside is back"


def test_a_recovered_root_answers_on_the_final_turn_its_lost_run_held(
    store: TraceStore, tmp_path: Path
) -> None:
    # make chaos seed 40 round 15: the tree ran out at its first call (the root's final
    # turn reserved), the worker froze on that call past its lease, and the recovered run
    # was refused its final turn: the root ended `completed` with no answer.
    model = ScriptedModel([text("what I have")])
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), store=store, clients={"m": model}
    )
    runtime = local.runtime
    root = create_root(runtime, TaskSpec("t", model="m", budget=Budget(tokens=4_600)))
    budgets = runtime.gate.budgets
    assert budgets is not None
    assert budgets.reserve(root.trace_id, root.trace_id, 5_000, 0.0) == Reserved(final=True)

    run_to_end(Runner(runtime), root.trace_id)  # the recovered run

    ended = store.get_trace(root.trace_id)
    assert (ended.status, ended.run.stop_reason) == ("completed", "budget"), ended.error
    assert ended.answer, "the final turn answered"
    notes = [m for m in store.messages(root.trace_id) if m.content == FINAL_NOTE]
    assert len(notes) == 1


def test_the_final_note_is_said_once_when_a_root_runs_its_final_turn_again() -> None:
    from fleet.loop.call import note

    said = Message(trace_id="r", role="user", content=FINAL_NOTE)
    assert (
        note(
            Runtime.__new__(Runtime),
            Trace(trace_id="r", root_trace_id="r", task="t"),
            [said],
            final=True,
        )
        is None
    )
