"""`fleet.Fleet`: submit tasks to a running fleet from scripts and notebooks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet import lifecycle
from fleet.backends import Backend, RunsNoAgents
from fleet.backends import load_backend as load_backend
from fleet.control import subtree
from fleet.conversation import approval, human
from fleet.conversation.continuation import continue_trace, stamp, turn_of
from fleet.conversation.fanout import fan_out_task
from fleet.conversation.human import waiting_traces
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import BrokerUnavailable, FleetError
from fleet.experiences.model import Experience
from fleet.experiences.store import ExperienceStore
from fleet.lifecycle import stop_subtree
from fleet.limits.budget import Budget
from fleet.limits.trees import Priority
from fleet.models import Event, Mode, Trace
from fleet.runtime import Runtime
from fleet.settings import Settings, process_settings
from fleet.storage.store import TraceStore
from fleet.storage.watchdog import QueueWatch, check_served

if TYPE_CHECKING:
    from fleet.batch.values import BatchEntry, BatchResult

OUTAGE_RETRY_S = 1.0
"""How often `Fleet.events` tries again while Redis cannot be reached."""
EVENT_BLOCK_MS = 1000
"""How long one read of the event stream waits for the next event."""
CANCEL_POLL_MS = 200
"""...and with a `cancel` event, which a signal handler sets but which cannot wake a read."""


@dataclass(frozen=True)
class Handle:
    """A submitted root trace."""

    trace_id: str
    fleet: Fleet
    turn: int = 0
    """Which run of the root this handle follows (a continue starts a new one)."""

    def wait(self, timeout_s: float | None = None) -> Trace:
        """Block until the trace ends; `TimeoutError` after `timeout_s`."""
        return self.fleet.wait(self.trace_id, timeout_s, turn=self.turn)

    def trace(self) -> Trace:
        """The trace as it is now."""
        return self.fleet.trace(self.trace_id)

    def events(
        self, timeout_s: float | None = None, *, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """The tree's events as they happen, until the root finishes (or `cancel` is set)."""
        return self.fleet.events(self.trace_id, timeout_s, turn=self.turn, cancel=cancel)


class Fleet:
    """A client of a running fleet: `Fleet.from_env().submit("task").wait()`."""

    def __init__(self, runtime: Runtime, backend: Backend) -> None:
        """Use `from_env` unless you assemble the pieces yourself."""
        self.runtime = runtime
        self.store: TraceStore = runtime.store
        self.backend = backend

    @classmethod
    def from_env(cls, settings: Settings | None = None) -> Fleet:
        """Connect to FLEET_REDIS_URL / FLEET_BROKER_URL; `ConfigError` if Redis is down."""
        from fleet.storage.redis_store import RedisStore

        settings = settings or process_settings()
        store = RedisStore.from_url(
            settings.redis_url, settings.redis_sentinel_master, cluster=settings.redis_cluster
        )
        store.ping()
        runtime = Runtime.build(settings, store, RunsNoAgents(), runs_agents=False)
        return cls(runtime, load_backend(settings))

    def submit(
        self,
        task: str,
        *,
        model: str | None = None,
        preset: str = "default",
        workspace: Path | None = None,
        metadata: dict[str, Any] | None = None,
        mode: Mode = "main",
        budget: Budget | None = None,
        max_concurrent: int | None = None,
        priority: Priority = "interactive",
        images: Sequence[str | Path] = (),
        human_timeout_s: int | None = None,
        batch_api: bool = False,
    ) -> Handle:
        """Create a root trace and enqueue it on its mode's queue.

        Args:
            task: What the agent should do.
            model: Model name or alias; else the preset's, the config's default.
            preset: Agent preset of the root.
            workspace: Workspace root (must lie under FLEET_WORKSPACE_ROOTS).
            metadata: The caller's own data, kept on the trace as it is (the fleet never reads it).
            mode: `main` (may spawn sub-agents), or a single `delegate`/`explore`/`evaluate`.
            budget: What the whole tree may spend (`fleet.limits.budget.Budget`); see
                docs/limits.md.
            max_concurrent: Children of the tree running at once.
            priority: `batch` trees are served after `interactive` ones.
            images: File paths (read here) or http(s) URLs (fetched here, through the SSRF
                guard) of PNG/JPEG/GIF/WebP images the model is shown with the task.
            human_timeout_s: How long the tree's waits on a person last (else the fleet's).
            batch_api: Every model call of the tree goes through its provider's Batch API.
        """
        spec = TaskSpec(task, model, preset, workspace, mode, metadata, batch_api=batch_api)
        spec = replace(spec, human_timeout_s=human_timeout_s)
        if images:
            from fleet.tools.imagesource import load_images  # its checks only when asked

            spec = replace(
                spec, images=load_images(images, web_allow=self.runtime.settings.web_allow)
            )
        return self.submit_spec(
            spec,
            budget=budget,
            max_concurrent=max_concurrent,
            priority=priority,
        )

    def submit_spec(
        self,
        spec: TaskSpec,
        *,
        model: str | None = None,
        workspace: Path | None = None,
        budget: Budget | None = None,
        max_concurrent: int | None = None,
        priority: Priority = "interactive",
    ) -> Handle:
        """Create and enqueue the root of `spec`; the keyword options override its fields."""
        spec = replace(
            spec,
            model=model or spec.model,
            workspace=workspace or spec.workspace,
            budget=budget,
            max_concurrent=max_concurrent,
            priority=priority,
        )
        chosen = (spec.workspace or self.runtime.settings.workspace).expanduser().resolve()
        check_served(self.store, self.backend.queue(spec.mode), chosen)
        trace = create_root(self.runtime, spec)
        try:
            self.enqueue(trace, priority)
        except BrokerUnavailable as exc:  # no task will ever run it: not left `queued`
            lifecycle.fail(self.runtime, trace.trace_id, error=str(exc), reason="not_enqueued")
            raise
        return Handle(trace.trace_id, self)

    def enqueue(self, trace: Trace, priority: Priority = "interactive") -> None:
        """Run an already persisted root (a created or a re-attached batch entry)."""
        self.backend.enqueue(trace, priority)

    def delegate(self, task: str, **options: Any) -> Handle:
        """One sub-agent with full tools, no main agent around it."""
        return self.submit(task, mode="delegate", **options)

    def explore(self, tasks: list[str], **options: Any) -> list[Handle]:
        """One read-only explore sub-agent per task, in parallel."""
        options.setdefault("preset", "explore")
        return [self.submit(t, mode="explore", **options) for t in tasks]

    def explore_tree(
        self, tasks: Sequence[str], *, preset: str = "explore", **options: Any
    ) -> Handle:
        """One tree: a root that explores `tasks`, one read-only branch each, no model deciding.

        The root's answer is every branch's result and its collaborators are the branches,
        so budgets, limits and `stop` apply to the whole exploration
        (`fleet.conversation.fanout`). `options` are `submit_spec`'s (model, workspace,
        budget, max_concurrent, priority).
        """
        chosen = tuple(tasks)
        spec = TaskSpec(fan_out_task(chosen), fan_out=chosen, fan_out_preset=preset)
        return self.submit_spec(spec, **options)

    def evaluate(self, goal: str, **options: Any) -> Handle:
        """A read-only judge of whether `goal` is met in the workspace."""
        task = f"Evaluate whether this goal has been met.\n\nGoal: {goal}\n\nEnd with VERDICT."
        options.setdefault("preset", "evaluate")
        return self.submit(task, mode="evaluate", **options)

    def batch(
        self,
        tasks: Iterable[str | Mapping[str, Any] | BatchEntry],
        *,
        max_in_flight: int = 8,
        on_result: Callable[[BatchResult], None] | None = None,
        timeout_s: float | None = None,
        batch_api: bool | None = None,
    ) -> Iterator[BatchResult]:
        """Run many root tasks, at most `max_in_flight` unfinished at once; results as they end.

        `tasks` are strings or dicts like a batch file's entries (`id`, `task`, `preset`,
        `model`, `workspace`, `metadata`, `batch_api`). All are validated here, before
        anything is submitted (`BatchInputError`); submitting starts when the iterator is
        consumed. `batch_api=True`: every model call of every tree goes through its
        provider's Batch API (half the price, answers within hours; docs/batch.md), unless
        an entry says otherwise; None leaves it to each model alias's `batch_api`.
        """
        from fleet.batch.file import (  # not loaded by `fleet run`
            check_entries,
            entries_from,
            with_defaults,
        )
        from fleet.batch.run import BatchOptions, run_batch

        entries = with_defaults(entries_from(tasks), batch_api=batch_api)
        check_entries(self.runtime, entries, "<batch>")
        options = BatchOptions(max_in_flight=max_in_flight, timeout_s=timeout_s)
        return run_batch(self, entries, options, on_result=on_result)

    def trace(self, trace_id: str) -> Trace:
        """The trace as it is now; `TraceNotFound` if unknown."""
        return self.store.get_trace(trace_id)

    def stop(self, trace_id: str) -> list[str]:
        """Stop a trace and its subtree; returns the ids that were told to stop."""
        turn = turn_of(self.store.get_trace(trace_id))
        ids = stop_subtree(self.runtime, trace_id)
        self.backend.revoke([stamp(t, turn) for t in ids])
        return ids

    def continue_trace(
        self, trace_id: str, message: str, after_sequence: int | None = None
    ) -> Handle:
        """Continue a finished root with a new user message and run it on any worker.

        With `after_sequence` the conversation first goes back to that message (rewind);
        the old branch stays in the trace. `ConversationError` names what does not fit.
        """
        trace = continue_trace(self.runtime, trace_id, message, after_sequence)
        self.backend.enqueue(trace)
        return Handle(trace_id, self, turn_of(trace))

    def reply(self, trace_id: str, answer: str) -> Handle:
        """Answer the question a trace waits on (`ask_human`); it resumes on any worker."""
        trace = human.reply(self.runtime, trace_id, answer)
        self.backend.enqueue(trace)
        return Handle(trace_id, self, turn_of(trace))

    def approve(self, trace_id: str, approval_id: str | None = None) -> Handle:
        """Approve the tool call a trace waits on; a worker runs it, then the trace goes on.

        `approval_id` (the call's tool_call_id), when given, must be the pending call.
        `ConversationError` when no approval is pending, the id differs, or it was answered.
        """
        trace = approval.approve(self.runtime, trace_id, approval_id)
        self.backend.enqueue(trace)
        return Handle(trace_id, self, turn_of(trace))

    def deny(self, trace_id: str, reason: str, approval_id: str | None = None) -> Handle:
        """Deny the pending tool call: nothing runs, the model reads `reason`; as `approve`."""
        trace = approval.deny(self.runtime, trace_id, reason, approval_id)
        self.backend.enqueue(trace)
        return Handle(trace_id, self, turn_of(trace))

    @property
    def experiences(self) -> ExperienceStore:
        """The fleet's experiences: `put`, `get`, `all(scope)`, `remove` (`fleet.experiences`)."""
        assert self.runtime.experiences is not None  # Runtime.build always gives one
        return self.runtime.experiences

    def reflect(
        self, trace_id: str, *, model: str | None = None, timeout_s: float | None = None
    ) -> list[Experience]:
        """Run a read-only reflection over a finished tree; store what it proposes, unapproved.

        Unless FLEET_EXPERIENCE_AUTO_APPROVE matches `execution:SCOPE` (the operator's policy).

        `ConversationError` if the tree has not finished; `TraceNotFound` if there is none.
        """
        from fleet.experiences.reflect import REFLECT_PRESET, proposals, reflection_task

        task = reflection_task(self.store, trace_id)
        handle = self.submit(task, model=model, preset=REFLECT_PRESET)
        done = handle.wait(timeout_s)
        policy = self.runtime.settings.experience_auto_approve
        proposed = proposals(done.answer or "", subtree(self.store, trace_id), policy)
        for experience in proposed:
            self.experiences.put(experience)
        return proposed

    def waiting(self, limit: int = 50) -> list[Trace]:
        """Traces waiting on a person, newest first."""
        return waiting_traces(self.store, limit)

    def events(
        self,
        trace_id: str,
        timeout_s: float | None = None,
        *,
        turn: int = 0,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Events of the trace's tree until it finishes.

        With `turn`, the events of that run of a continued root: earlier runs (and their
        `finish`) are skipped up to the event that started it. With `cancel`, the events
        end, without an error, within `CANCEL_POLL_MS` of it being set.

        Raises:
            TimeoutError: `timeout_s` passed first.
            NoLiveWorkers: no live worker consumed a queue the trace needs for
                `Settings.no_worker_timeout_s`; the trace is left as it is.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        root = self._reachable(lambda: self.store.get_trace(trace_id), deadline).root_trace_id
        watch = QueueWatch(
            self.store, trace_id, self.backend.queue, self.runtime.settings.no_worker_timeout_s
        )
        cursor, skipping = "0", turn > 0
        block_ms = EVENT_BLOCK_MS if cancel is None else CANCEL_POLL_MS
        cancel = cancel or threading.Event()  # never set: follow to the end
        while not cancel.is_set():
            late = deadline is not None and time.monotonic() > deadline
            polled = self._poll(trace_id, root, cursor, watch, block_ms)
            if polled is None:  # Redis away (a restart, the network): wait for it
                if late:
                    raise TimeoutError(f"trace {trace_id!r}: Redis unreachable")
                cancel.wait(OUTAGE_RETRY_S)
                continue
            finished, batch = polled
            if not finished and late:
                raise TimeoutError(f"trace {trace_id!r} still running after {timeout_s} s")
            for entry_id, event in batch:
                cursor = entry_id
                if skipping:
                    skipping = not _starts_turn(event, trace_id, turn)
                    continue
                yield event
                if event.kind == "finish" and event.trace_id == trace_id:
                    return
            if finished and not batch:
                return  # its `finish` fell off the capped stream

    def _reachable(self, read: Callable[[], Trace], deadline: float | None) -> Trace:
        """`read()`, tried again every OUTAGE_RETRY_S while Redis is away until `deadline`.

        Away: a restart, or a Sentinel failover before the new master is named.
        """
        while True:
            try:
                return read()
            except Exception as exc:
                late = deadline is not None and time.monotonic() > deadline
                if late or not self.store.unavailable(exc):
                    raise
            time.sleep(OUTAGE_RETRY_S)

    def _poll(
        self, trace_id: str, root: str, cursor: str, watch: QueueWatch, block_ms: int
    ) -> tuple[bool, list[tuple[str, Event]]] | None:
        """Whether the trace ended, and the events after `cursor` (waiting up to `block_ms`).

        Ended already: its last events (its `finish` included) are still to be read.
        None when Redis cannot be reached.
        """
        try:
            finished = self.store.get_trace(trace_id).is_terminal
            batch = self.store.read_events(root, cursor, block_ms=block_ms)
        except Exception as exc:
            if not self.store.unavailable(exc):
                raise
            return None
        if not finished:
            watch.check()
        return finished, batch

    def wait(self, trace_id: str, timeout_s: float | None = None, *, turn: int = 0) -> Trace:
        """Block until the trace ends, reading its event stream (of run `turn`)."""
        for _ in self.events(trace_id, timeout_s, turn=turn):
            pass
        deadline = time.monotonic() + (timeout_s or self.runtime.settings.no_worker_timeout_s)
        trace = self._reachable(lambda: self.store.get_trace(trace_id), deadline)
        if not trace.is_terminal:
            raise FleetError(f"trace {trace_id!r} ended its event stream in {trace.status!r}")
        return trace


def _starts_turn(event: Event, trace_id: str, turn: int) -> bool:
    return event.kind == "trace" and event.trace_id == trace_id and event.data.get("turn") == turn
