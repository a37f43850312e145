"""The fast paths of a branch keep what is stored and what is handed out as it was.

The encoders take shortcuts for speed (`redis_writes._to_json` skips the JSON encoder for
scalars): they are held to the plain encoder's text. Values worked out once and reused
(a spawn's ceiling, a tool set's schemas) are never shared mutable objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet.children.subagents import child_ceiling, spawn
from fleet.goals import GoalTree
from fleet.inprocess import InProcessDispatcher
from fleet.llm.base import LLMResponse, ToolCall, Usage
from fleet.loop import steps
from fleet.loop.steps import CallTools, DoomLoop, Finish, Step
from fleet.models import ToolCeiling, Trace, TraceStats
from fleet.runstate import RunState
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis import writes as redis_writes
from fleet.storage.writes import TraceWrite
from fleet.testing import ScriptedModel

VALUES: list[Any] = [
    "",
    "plain",
    'quotes " and \\ backslashes',
    "control \x00\x01\x1f\n\t\r and del \x7f",
    "unicode é ü 漢字 🚀 and a lone surrogate \ud800",
    "\u2028\u2029",
    0,
    -1,
    2**70,
    -(2**70),
    True,
    False,
    None,
    0.0,
    -0.0,
    0.1,
    1e300,
    123456789.123,
    float("nan"),
    float("inf"),
    float("-inf"),
    [],
    {},
    ["a", 1, None, True, 2.5, {"k": ["v"]}],
    {"nested": {"list": [1, 2, {"x": "é"}]}, "empty": {}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_to_json_is_json_dumps(value: Any) -> None:
    assert redis_writes._to_json(value) == json.dumps(value, ensure_ascii=False)


def _reference_encode(fields: dict[str, Any]) -> list[str]:
    return [item for k, v in fields.items() for item in (k, json.dumps(v, ensure_ascii=False))]


def _full_trace() -> Trace:
    goals = GoalTree()
    goals.add("find the bug 🐛")
    return Trace(
        trace_id="root@explore-007-20250101T000000-002",
        root_trace_id="root",
        parent_trace_id="root",
        mode="explore",
        status="running",
        task='Branch 7: "quoted" \\ and ü\n',
        name="explore-007",
        preset="explore",
        model="scripted:x.yaml",
        workspace="/tmp/ws",
        parent_tool_call_id="call_1",
        context={"messages": [{"role": "user", "content": "hi"}], "extra": {"n": 1.5}},
        skills=["a", "b"],
        metadata={"otel": {"traceparent": "00-ab-cd-01"}, "turn": 3, "flag": True},
        run=RunState(otel={"traceparent": "00-ab-cd-01"}, turn=3, stop_reason="ü"),
        ceiling=ToolCeiling(allowed=["read_file", "list_dir"], denied=["bash"], read_only=True),
        answer=None,
        output={"verdict": "pass", "score": 0.5},
        error="boom",
        iteration=2,
        head_sequence=None,
        last_sequence=9,
        stats=TraceStats(messages=3, prompt_tokens=20, cost_usd=0.000125, duration_ms=7),
        goals=goals,
    )


@pytest.mark.parametrize(
    "trace",
    [_full_trace(), Trace(trace_id="t", root_trace_id="t", task="")],
    ids=["full", "bare"],
)
def test_create_call_is_json_dumps_of_each_field(trace: Trace) -> None:
    _, args = redis_writes.create_call([trace])
    run = trace.run.model_dump(mode="json", exclude_defaults=True)
    run = {f"r:{k}": v for k, v in {**run, "schema_version": trace.run.schema_version}.items()}
    assert args[6:] == _reference_encode(trace.model_dump(mode="json", exclude={"run"}) | run)


def test_set_fields_are_json_dumps_of_each_field() -> None:
    trace = _full_trace()
    fields = {"status": "failed", "error": "é\n\x00", "metadata": trace.metadata, "iteration": 4}
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(None, **fields)  # type: ignore[arg-type]
    _, args = redis_writes.apply_call(write)
    items = args[args.index("set") + 3 :]
    values = dict(zip(items[0::2], items[1::2], strict=True))
    assert values.pop("updated_at_ms").isdigit()
    assert values == {k: json.dumps(v, ensure_ascii=False) for k, v in fields.items()}


@pytest.fixture
def runtime(tmp_path: Path) -> Runtime:
    settings = Settings(workspace=tmp_path, allow_scripted=True, env={})
    return Runtime.build(settings, MemoryStore(), InProcessDispatcher())


def _parent(runtime: Runtime, **fields: Any) -> Trace:
    parent = Trace(trace_id="root", root_trace_id="root", task="survey", **fields)
    runtime.store.create_trace(parent)
    return parent


@pytest.mark.parametrize(
    "ceiling",
    [ToolCeiling(), ToolCeiling(allowed=["read_file", "list_dir", "agent"], denied=["glob"])],
    ids=["open", "narrowed"],
)
def test_explore_children_each_own_their_ceiling(runtime: Runtime, ceiling: ToolCeiling) -> None:
    parent = _parent(runtime, ceiling=ceiling)
    arguments = json.dumps({"task": ["one", "two", "three"]})
    request = spawn(runtime, parent, ToolCall(id="call_1", name="agent", arguments=arguments))
    expected = child_ceiling(runtime, parent)
    ceilings = [child.ceiling for child in request.children]
    assert all(c == expected for c in ceilings)
    assert [runtime.store.get_trace(c.trace_id).ceiling for c in request.children] == ceilings
    ceilings[0].denied.append("read_file")  # one child's ceiling is its own
    assert all(c == expected for c in ceilings[1:])
    assert len({id(c) for c in ceilings}) == len({id(c.denied) for c in ceilings}) == 3


SCRIPT = """
scripts:
  - match: "^when"
    steps:
      - tool_calls:
          - {name: read_file, arguments: {path: "a.txt"}}
          - {name: list_dir}
      - content: "{task} | {last_tool} | {last_user} | {turn} | {other} | {last_tool!r}"
  - match: "^dated"
    steps:
      - tool_calls: [{name: list_dir, arguments: {since: 2024-01-01}}]
"""


def test_a_yaml_script_answers_as_it_did(tmp_path: Path) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(SCRIPT)
    model = ScriptedModel.from_file(path)
    first: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "when x"},
    ]
    assert model.complete(first, []) == LLMResponse(
        content=None,
        tool_calls=(
            ToolCall(id="call_0_0", name="read_file", arguments='{"path": "a.txt"}'),
            ToolCall(id="call_0_1", name="list_dir", arguments="{}"),
        ),
        usage=Usage(prompt_tokens=10, completion_tokens=7),  # len('["{\\"path\\"...]') // 4
        model="scripted",
    )
    later: list[dict[str, Any]] = [
        *first,
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two"},
        {"role": "user", "content": "more"},
    ]
    content = "when x | two | more | 1 | {other} | 'two'"
    assert model.complete(later, []) == LLMResponse(
        content=content, usage=Usage(10, len(content + "[]") // 4), model="scripted"
    )
    with pytest.raises(TypeError, match="not JSON serializable"):  # when used, as it was
        model.complete([{"role": "user", "content": "dated"}], [])


def _decide_as_before(
    response: LLMResponse, previous_calls: list[tuple[str, str]], repeats: int
) -> Step:
    """`decide_next` as it was: every call's arguments made canonical."""
    if not response.tool_calls:
        return Finish(response.content or "")
    current = [(c.name, c.arguments) for c in response.tool_calls]
    combined = [(n, steps._canonical(a)) for n, a in previous_calls + current]
    tail = combined[-repeats:]
    if len(tail) == repeats and len(set(tail)) == 1:
        return DoomLoop(response.tool_calls[-1], repeats)
    return CallTools(response.tool_calls)


_LS = ("list_dir", '{"path": "."}')
_LS_SPACED = ("list_dir", '{ "path" :"." }')
_LS_OTHER = ("list_dir", '{"path": "src"}')
_READ = ("read_file", '{"path": "."}')
_BAD = ("list_dir", "{not json")


@pytest.mark.parametrize("repeats", [0, 1, 2, 3, 4])
@pytest.mark.parametrize(
    ("previous", "current"),
    [
        ([], []),
        ([], [_LS]),
        ([_LS], [_LS]),
        ([_LS, _LS], [_LS]),
        ([_LS, _LS_SPACED], [_LS]),
        ([_LS, _LS_OTHER], [_LS]),
        ([_READ, _LS], [_LS]),
        ([_LS], [_LS, _LS]),
        ([_LS, _LS], [_LS, _READ]),
        ([_BAD, _BAD], [_BAD]),
        ([_BAD, _LS], [_LS]),
        ([("list_dir", "")], [("list_dir", "{}"), ("list_dir", "")]),
    ],
)
def test_decide_next_decides_as_before(
    previous: list[tuple[str, str]], current: list[tuple[str, str]], repeats: int
) -> None:
    calls = tuple(ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(current))
    response = LLMResponse(content="done", tool_calls=calls)
    expected = _decide_as_before(response, previous, repeats)
    assert steps.decide_next(response, previous, repeats) == expected
