"""The Python surface: create root traces, run them in-process, or submit them to a fleet."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet import human, ids
from fleet.budget import Budget
from fleet.conversation import continue_trace
from fleet.dispatch import InProcessDispatcher
from fleet.errors import ConfigError
from fleet.llm.base import LLMClient
from fleet.models import Event, Mode, Trace
from fleet.otel import make_hooks
from fleet.runner import Runner, run_to_end
from fleet.runtime import Dispatcher, Runtime
from fleet.settings import Settings
from fleet.store import MemoryStore, TraceStore
from fleet.trees import DEFAULT_SCHEDULE, Priority, Schedule


@dataclass(frozen=True)
class TaskSpec:
    """One task to run as a root trace."""

    task: str
    model: str | None = None
    preset: str = "default"
    workspace: Path | None = None
    mode: Mode = "main"
    metadata: Mapping[str, Any] | None = None
    budget: Budget | None = None
    """What the whole tree may spend; the preset's budget fills what it leaves open."""
    max_concurrent: int | None = None
    """Children of the tree running at once (else the preset's, else unbounded)."""
    priority: Priority = "interactive"
    """`batch` trees are served after `interactive` ones."""


def create_root(runtime: Runtime, spec: TaskSpec) -> Trace:
    """Validate the spec (preset, model, workspace) and persist a queued root trace.

    Raises:
        ConfigError: Unknown preset or model, missing API key, bad workspace.
    """
    if not spec.task.strip():
        raise ConfigError("the task is empty")
    runtime.preset(spec.preset)
    model = runtime.model_name(spec.model, spec.preset)
    runtime.check_model(model)
    workspace = runtime.settings.with_workspace(spec.workspace or runtime.settings.workspace)
    trace_id = ids.root_id()
    trace = Trace(
        trace_id=trace_id,
        root_trace_id=trace_id,
        mode=spec.mode,
        task=spec.task,
        name="main",
        preset=spec.preset,
        model=_portable(model),
        workspace=str(workspace.workspace),
        metadata=dict(spec.metadata or {}),
    )
    _control(runtime, spec, trace_id)
    runtime.store.create_trace(trace)
    runtime.store.emit(trace_id, Event(kind="trace", trace_id=trace_id, status="queued"))
    return trace


def _control(runtime: Runtime, spec: TaskSpec, trace_id: str) -> None:
    """The tree's budget and schedule, written before its root exists (workers see them)."""
    preset = runtime.preset(spec.preset)
    budget = (spec.budget or Budget()).over(preset.budget)
    schedule = Schedule(spec.max_concurrent or preset.max_concurrent, spec.priority)
    budgets, trees = runtime.gate.budgets, runtime.trees
    if not budget.empty:
        if budgets is None:
            raise ConfigError("budgets need the Redis store: run through the fleet")
        budgets.create(trace_id, budget)
    if schedule != DEFAULT_SCHEDULE and trees is not None:
        trees.create(trace_id, schedule)


def _portable(model: str) -> str:
    """`scripted:rel.yaml` becomes absolute so a worker in another directory finds it."""
    if model.startswith("scripted:"):
        return "scripted:" + str(Path(model.removeprefix("scripted:")).expanduser().resolve())
    return model


class LocalFleet:
    """A whole agent tree in this process: explore branches run in threads."""

    def __init__(self, runtime: Runtime) -> None:
        """Wrap a runtime; see `from_settings` for the usual construction."""
        self.runtime = runtime
        self.store = runtime.store

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        redis: bool = False,
        store: TraceStore | None = None,
        clients: Mapping[str, LLMClient] | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> LocalFleet:
        """In-memory store unless `redis` (FLEET_REDIS_URL) or a store is given."""
        if store is None:
            store = _redis_store(settings.redis_url) if redis else MemoryStore()
        runtime = Runtime.build(
            settings,
            store,
            dispatcher or InProcessDispatcher(),
            clients=clients,
            hooks=make_hooks(settings, store),
        )
        return cls(runtime)

    def run(
        self,
        task: str,
        *,
        model: str | None = None,
        preset: str = "default",
        metadata: Mapping[str, Any] | None = None,
    ) -> Trace:
        """Create a root trace, run it until it ends or waits on a person, return it."""
        spec = TaskSpec(task=task, model=model, preset=preset, metadata=metadata)
        trace = create_root(self.runtime, spec)
        return self._run(trace.trace_id)

    def continue_trace(
        self, trace_id: str, message: str, after_sequence: int | None = None
    ) -> Trace:
        """Continue a finished root with `message` (after message `after_sequence`), run it."""
        continue_trace(self.runtime, trace_id, message, after_sequence)
        return self._run(trace_id)

    def reply(self, trace_id: str, answer: str) -> Trace:
        """Answer the question a trace waits on and run it on."""
        human.reply(self.runtime, trace_id, answer)
        return self._run(trace_id)

    def _run(self, trace_id: str) -> Trace:
        run_to_end(Runner(self.runtime), trace_id)
        return self.store.get_trace(trace_id)


def _redis_store(url: str) -> TraceStore:
    from fleet.redis_store import RedisStore

    store = RedisStore.from_url(url)
    store.ping()
    return store
