"""Batches: file validation, the window runner, the results journal, and `Fleet.batch`.

Validation and the runner are tested on the in-memory store with a thread-pool backend;
`Fleet.batch` runs against a real Redis and a real worker process.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.batch.file import (
    BatchInputError,
    build_entries,
    check_entries,
    entries_from,
    load_entries,
    with_defaults,
)
from fleet.batch.journal import ResultsJournal, sidecar_path
from fleet.batch.run import BatchEntry, BatchOptions, ResumeState, run_batch
from fleet.client import Fleet
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import ConfigError
from fleet.inprocess import InProcessDispatcher
from fleet.limits.trees import Priority
from fleet.llm.base import LLMResponse
from fleet.loop.runner import Runner, run_safely
from fleet.models import Mode, Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel, call, text
from tests.fleetkit import client, fleet_settings

MODEL = "test-model"

# -- validation ----------------------------------------------------------------

JSONL_PROBLEMS = [
    ('{"task": "a"}\n{"task": "b", "colour": "red"}\n', 2, "unknown key 'colour'"),
    ('{"task": "a"}\n{"task": ""}\n', 2, "empty task"),
    ('{"task": "a"}\n{"task": "  \\n "}\n', 2, "empty task"),
    (
        '{"id": "x", "task": "a"}\n{"id": "x", "task": "b"}\n',
        2,
        "duplicate id 'x' (first on line 1)",
    ),
    ('{"task": "a"}\n{"id": "line-1", "task": "b"}\n', 2, "duplicate id 'line-1'"),
    ('{"task": "a"}\n\n\n{"tsk": "a"}\n', 4, "unknown key 'tsk'"),
    ('{"task": "a"}\n{"task": 3}\n', 2, "'task': input should be a valid string"),
    ('{"task": "a"}\n{not json\n', 2, "invalid JSON"),
    ("[1, 2]\n", 1, "expected an object with a 'task', got list"),
    ('{"preset": "explore"}\n', 1, "missing required key 'task'"),
    ('{"task": "a", "metadata": [1]}\n', 1, "'metadata'"),
    ('{"task": "a", "id": ""}\n', 1, "empty id"),
    ("\n\n", 1, "no tasks in the batch"),
    ('{"task": "a", "memory": ["user:alice", "bob"]}\n', 1, "namespace 'bob'"),
    ('{"task": "a", "memory": "user:alice"}\n', 1, "'memory'"),
]


@pytest.mark.parametrize(("text", "line", "reason"), JSONL_PROBLEMS)
def test_jsonl_problems_name_file_and_line(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(text)
    with pytest.raises(BatchInputError) as caught:
        load_entries(path)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert reason in str(caught.value)


YAML_PROBLEMS = [
    ("- task: a\n- id: two\n  task: b\n  colour: red\n", 2, "unknown key 'colour'"),
    ("# comment\n- task: a\n-   task: ''\n", 3, "empty task"),
    (
        "tasks:\n  - id: x\n    task: a\n  - id: x\n    task: b\n",
        4,
        "duplicate id 'x' (first on line 2)",
    ),
    ("- task: a\n- task: [oops\n", 3, "invalid YAML"),
    ("task: a\n", 1, "expected a list of tasks"),
    ("- task: a\n- [1, 2]\n", 2, "got list"),
    ("- task: a\n- task: b\n  metadata: {when: 2024-01-01}\n", 2, "metadata must be plain JSON"),
]


@pytest.mark.parametrize(("text", "line", "reason"), YAML_PROBLEMS)
def test_yaml_problems_name_the_entry_line(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(text)
    with pytest.raises(BatchInputError) as caught:
        load_entries(path)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert reason in str(caught.value)


def test_every_problem_is_collected_before_failing(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    lines = ['{"task": "ok"}'] * 20
    lines[4], lines[9], lines[16] = '{"task": ""}', "{bad", '{"task": "x", "extra": 1}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BatchInputError) as caught:
        load_entries(path)
    assert [line for line, _ in caught.value.problems] == [5, 10, 17]
    assert str(caught.value).endswith("(and 2 more problems)")


def test_yaml_and_jsonl_entries_with_default_ids(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "tasks:\n  - just a string\n  - id: 7\n    task: b\n    preset: explore\n"
        "    workspace: ~/w\n    metadata: {k: [1, 2]}\n"
    )
    (tmp_path / "b.jsonl").write_text('"bare"\n\n{"task": "t", "model": "m"}\n')
    yaml_entries = load_entries(tmp_path / "a.yaml")
    assert [(e.id, e.task, e.line) for e in yaml_entries] == [
        ("line-2", "just a string", 2),
        ("7", "b", 3),
    ]
    assert yaml_entries[1].preset == "explore" and yaml_entries[1].metadata == {"k": [1, 2]}
    assert yaml_entries[1].workspace == Path("~/w").expanduser()
    jsonl_entries = load_entries(tmp_path / "b.jsonl")
    assert [(e.id, e.model) for e in jsonl_entries] == [("line-1", None), ("line-3", "m")]
    filled = with_defaults(jsonl_entries, model="x", preset="explore")
    assert [(e.model, e.preset) for e in filled] == [("x", "explore"), ("m", "explore")]
    # `fleet batch --workspace`: for entries that name none; an entry's own one wins.
    placed = with_defaults(yaml_entries, workspace=tmp_path)
    assert [e.workspace for e in placed] == [tmp_path, Path("~/w").expanduser()]


def test_an_entry_binds_memory_namespaces(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"task": "a", "memory": ["user:alice", "fleet", "user:alice"]}\n')
    [entry] = load_entries(path)
    assert entry.memory == ("user:alice", "fleet")


def test_entries_from_python_values_use_positions() -> None:
    entries = entries_from(["a", {"id": "b", "task": "bee"}, BatchEntry("c", "see", 99)])
    assert [(e.id, e.line) for e in entries] == [("line-1", 1), ("b", 2), ("c", 3)]
    with pytest.raises(BatchInputError, match=r"^<batch>:2: empty task"):
        entries_from(["a", ""])
    with pytest.raises(BatchInputError, match="duplicate id 'b'"):
        build_entries([(1, {"id": "b", "task": "x"}), (2, {"id": "b", "task": "y"})], "<x>")


def test_check_entries_names_the_line_create_root_would_refuse(tmp_path: Path) -> None:
    runtime = memory_runtime(tmp_path, ScriptedModel(["ok"]))
    good = BatchEntry("a", "t", 1, model=MODEL)
    check_entries(runtime, [good], "f.jsonl")
    cases = [
        (BatchEntry("b", "t", 4, preset="nope", model=MODEL), "f.jsonl:4: ", "nope"),
        (BatchEntry("c", "t", 5, model="scripted:/no/such.yaml"), "f.jsonl:5: ", "not found"),
        (
            BatchEntry("d", "t", 6, model=MODEL, workspace=tmp_path / "x"),
            "f.jsonl:6: ",
            "directory",
        ),
    ]
    for entry, prefix, reason in cases:
        with pytest.raises(BatchInputError) as caught:
            check_entries(runtime, [good, entry], "f.jsonl")
        assert str(caught.value).startswith(prefix) and reason in str(caught.value)
    assert runtime.store.list_traces() == []


# -- the window, on the in-memory store -----------------------------------------


def memory_runtime(tmp_path: Path, model: ScriptedModel) -> Runtime:
    settings = Settings(workspace=tmp_path, allow_scripted=True)
    return Runtime.build(settings, MemoryStore(), InProcessDispatcher(), clients={MODEL: model})


class ThreadBackend:
    """Runs each enqueued root in a thread pool, as a worker would; records the window."""

    def __init__(self, runtime: Runtime, threads: int = 8) -> None:
        self.runtime = runtime
        self.pool = ThreadPoolExecutor(threads)
        self.enqueued: list[str] = []
        self.peak_unfinished = 0

    def enqueue(self, trace: Trace, priority: Priority = "interactive") -> None:
        self.enqueued.append(trace.trace_id)
        self.peak_unfinished = max(self.peak_unfinished, unfinished_roots(self.runtime))
        self.pool.submit(run_safely, Runner(self.runtime), trace.trace_id)

    def revoke(self, trace_ids: list[str]) -> None:
        pass

    def queue(self, mode: Mode) -> None:
        return None  # threads here: no queue to be served


def unfinished_roots(runtime: Runtime) -> int:
    traces = runtime.store.list_traces(10_000)
    return sum(1 for t in traces if t.parent_trace_id is None and not t.is_terminal)


@pytest.fixture
def memory_fleet(tmp_path: Path) -> Iterator[tuple[Fleet, ThreadBackend]]:
    ticks = itertools.count()

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = str(messages[1]["content"])
        if task.startswith("forever"):  # a new listing each turn: no doom loop, never done
            return call("list_dir", path=f"./{next(ticks)}")
        return text(f"answer: {task}")

    runtime = memory_runtime(tmp_path, ScriptedModel(function=answer, latency_ms=20))
    backend = ThreadBackend(runtime)
    yield Fleet(runtime, backend), backend
    backend.pool.shutdown(wait=True, cancel_futures=True)


def entries(count: int, prefix: str = "task") -> list[BatchEntry]:
    return [BatchEntry(f"e{i}", f"{prefix} {i}", i, model=MODEL) for i in range(count)]


def test_the_window_never_holds_more_than_max_in_flight(
    memory_fleet: tuple[Fleet, ThreadBackend],
) -> None:
    fleet, backend = memory_fleet
    seen: list[str] = []
    results = list(
        run_batch(
            fleet, entries(40), BatchOptions(max_in_flight=4), on_result=lambda r: seen.append(r.id)
        )
    )
    assert sorted(r.id for r in results) == sorted(f"e{i}" for i in range(40))
    assert seen == [r.id for r in results]
    assert {r.status for r in results} == {"completed"}
    assert results[0].answer is not None and results[0].stats["messages"] == 1
    assert 2 <= backend.peak_unfinished <= 4
    roots = [t for t in fleet.store.list_traces(100) if t.parent_trace_id is None]
    assert {t.run.batch_entry for t in roots} == {f"e{i}" for i in range(40)}


def test_a_batch_root_is_bound_to_its_entry_namespaces(
    memory_fleet: tuple[Fleet, ThreadBackend],
) -> None:
    fleet, _ = memory_fleet
    bound = BatchEntry("m", "task m", 1, model=MODEL, memory=("user:alice",))
    [result] = run_batch(fleet, [bound, *entries(0)], BatchOptions(max_in_flight=2))
    assert fleet.trace(result.trace_id).memory == ["user:alice"]


def test_an_overdue_task_is_stopped_and_reported(
    memory_fleet: tuple[Fleet, ThreadBackend],
) -> None:
    fleet, _ = memory_fleet
    batch = [*entries(3), BatchEntry("slow", "forever listing", 9, model=MODEL)]
    results = {r.id: r for r in run_batch(fleet, batch, BatchOptions(timeout_s=0.3))}
    assert results["slow"].status == "stopped"
    assert "timed out after 0.3 s" in (results["slow"].error or "")
    assert {results[f"e{i}"].status for i in range(3)} == {"completed"}


def test_resume_skips_finished_ids_and_follows_submitted_roots(
    memory_fleet: tuple[Fleet, ThreadBackend],
) -> None:
    fleet, backend = memory_fleet
    earlier = create_root(fleet.runtime, TaskSpec("task 2", MODEL))
    state = ResumeState(done_ids=frozenset({"e0", "e1"}), attached={"e2": earlier.trace_id})
    results = list(run_batch(fleet, entries(6), resume=state))
    assert sorted(r.id for r in results) == ["e2", "e3", "e4", "e5"]
    by_id = {r.id: r for r in results}
    assert by_id["e2"].trace_id == earlier.trace_id and by_id["e2"].status == "completed"
    assert backend.enqueued.count(earlier.trace_id) == 1, "a queued root is re-enqueued once"
    assert len(backend.enqueued) == 4
    gone = ResumeState(attached={"e0": "20200101T000000-000000"})
    (lost,) = run_batch(fleet, entries(1), resume=gone)
    assert lost.status == "failed" and "not found" in (lost.error or "")


def test_fleet_batch_validates_everything_before_submitting(
    memory_fleet: tuple[Fleet, ThreadBackend],
) -> None:
    fleet, backend = memory_fleet
    with pytest.raises(BatchInputError, match=r"^<batch>:3: unknown key 'colour'"):
        fleet.batch([{"task": "a", "model": MODEL}, "b", {"task": "c", "colour": 1}])
    assert backend.enqueued == [] and fleet.store.list_traces() == []


# -- the results journal ----------------------------------------------------------


def test_existing_results_need_resume(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    ResultsJournal.open(out, resume=False).close()
    ResultsJournal.open(out, resume=False).close()  # only a header so far: still empty
    out.write_text('{"id": "a", "status": "completed"}\n')
    with pytest.raises(ConfigError, match="--resume"):
        ResultsJournal.open(out, resume=False)


def test_resume_cuts_a_torn_line_and_adopts_an_orphan_root(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    journal = ResultsJournal.open(out, resume=False)
    runtime = memory_runtime(tmp_path, ScriptedModel(["ok"]))
    first, orphaned, never = (BatchEntry(i, "t", n, model=MODEL) for n, i in enumerate("abc"))
    journal.submitting(first)
    journal.submitted(first, "T-a")
    journal.submitting(orphaned)  # killed after creating the root, before writing its id
    spec = TaskSpec("t", MODEL, batch_key=journal.batch_key, batch_entry="b")
    orphan = create_root(runtime, spec)
    journal.submitting(never)  # killed before creating the root
    journal.close()
    with out.open("a") as handle:
        handle.write('{"id": "a", "trace_id": "T-a", "status": "completed"}\n{"id": "c", "tr')
    resumed = ResultsJournal.open(out, resume=True)
    state = resumed.resume_state(runtime.store)
    resumed.close()
    assert state.done_ids == {"a"}
    assert dict(state.attached) == {"b": orphan.trace_id}
    assert out.read_text().endswith('"completed"}\n'), "the torn line is cut off"
    sidecar = [json.loads(line) for line in sidecar_path(out).read_text().splitlines()]
    assert sidecar[-1] == {"id": "b", "trace_id": orphan.trace_id}


# -- Fleet.batch on a real worker -------------------------------------------------


def clear_traces(url: str) -> None:
    """Drop the fleet's keys (not the broker's: the worker's queue bindings live there)."""
    with redis.Redis.from_url(url) as admin:
        stale = list(admin.scan_iter("fleet:*", count=1000))
        if stale:
            admin.delete(*stale)


@pytest.mark.integration
def test_fleet_batch_on_a_worker_yields_results_as_they_finish(
    worker_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "model.yaml"
    script.write_text(
        "latency_ms: 20\nscripts:\n"
        "  - {match: '^fail', steps: [{raise: boom}]}\n"
        "  - {match: '.*', steps: [{content: 'answer: {task}'}]}\n"
    )
    clear_traces(worker_url)
    fleet = client(fleet_settings(worker_url, tmp_path))
    assert isinstance(fleet.store, RedisStore)
    model = f"scripted:{script}"
    tasks: list[dict[str, Any]] = [{"task": f"task {i}", "model": model} for i in range(24)]
    tasks.append({"id": "bad", "task": "fail now", "model": model})
    seen: list[str] = []
    batch = fleet.batch(tasks, max_in_flight=6, on_result=lambda r: seen.append(r.id))
    assert fleet.store.list_traces() == [], "nothing is submitted before iterating"
    results = list(batch)
    fleet.store.close()
    assert len(results) == 25 and seen == [r.id for r in results]
    by_id = {r.id: r for r in results}
    assert by_id["bad"].status == "failed" and "boom" in (by_id["bad"].error or "")
    assert by_id["line-1"].answer == "answer: task 0"
    assert sum(r.status == "completed" for r in results) == 24
