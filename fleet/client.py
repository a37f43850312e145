"""`fleet.Fleet`: submit tasks to a running fleet from scripts and notebooks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from fleet import lifecycle
from fleet.backends import Backend, RunsNoAgents, SendsWithRoot
from fleet.backends import load_backend as load_backend
from fleet.control import subtree
from fleet.conversation import approval, human, messages
from fleet.conversation.continuation import continue_trace, regenerate, stamp, turn_of
from fleet.conversation.fanout import fan_out_task
from fleet.conversation.human import waiting_traces
from fleet.conversation.prompts import with_task
from fleet.conversation.roots import TaskSpec, create_root
from fleet.discovery import client_settings, url_chosen
from fleet.errors import BrokerUnavailable, ConfigError
from fleet.experiences.model import Experience
from fleet.experiences.store import ExperienceStore
from fleet.lifecycle import stop_subtree
from fleet.limits.budget import Budget
from fleet.limits.trees import Priority
from fleet.loop.compact import Compacted, compact_now
from fleet.memory.board import MEMORY
from fleet.memory.desk import MemoryDesk
from fleet.models import Event, Mode, Trace
from fleet.observe.following import Follower
from fleet.remote.run import cancel_unwatched
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import Serving, TraceStore
from fleet.storage.watchdog import check_served, require_a_fleet

if TYPE_CHECKING:
    from fleet.batch.values import BatchEntry, BatchResult


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
        """Connect to the fleet `fleet.discovery` finds, as every `fleet` command does.

        FLEET_REDIS_URL (and FLEET_BROKER_URL), else the nearest `fleet up` of the working
        directory or above it (its private `up.json`), else the default Redis, said once
        on stderr. On a Redis nobody chose, nothing is written unless a live worker of the
        fleet consumes one of its queues: an unrelated Redis on the default port is left
        untouched (`NoLiveWorkers`, before any write).

        Raises:
            RedisUnreachable: the Redis does not answer.
            NoLiveWorkers: the Redis was the default one and no fleet runs there.
        """
        from fleet.storage.backends.redis.store import RedisStore

        settings = settings or client_settings()
        store = RedisStore.from_url(
            settings.redis_url, settings.redis_sentinel_master, cluster=settings.redis_cluster
        )
        store.ping()
        backend = load_backend(settings)
        if not url_chosen(settings):
            require_a_fleet(store, map(backend.queue, get_args(Mode)), settings.redis_url)
        runtime = Runtime.build(settings, store, RunsNoAgents(), runs_agents=False)
        return cls(runtime, backend)

    def submit(
        self,
        task: str | None = None,
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
        memory: Sequence[str] = (),
        human_timeout_s: int | None = None,
        batch_api: bool = False,
        prompt: Path | None = None,
        variables: Mapping[str, str] | None = None,
    ) -> Handle:
        """Create a root trace and enqueue it on its mode's queue.

        Args:
            task: What the agent should do (or give `prompt`).
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
            memory: Long-term memory namespaces the tree may use (`user:alice`); its
                children inherit them, and no model can name another (docs/memory.md).
            human_timeout_s: How long the tree's waits on a person last (else the fleet's).
            batch_api: Every model call of the tree goes through its provider's Batch API.
            prompt: A `.prompt` file (`fleet.conversation.prompts`) in place of `task`: its
                `$user$` part is the task, `$system$` joins the system prompt, its front
                matter's model and temperature apply (`model` still wins).
            variables: The values of the prompt file's `%variables%`.
        """
        spec = TaskSpec("", model, preset, workspace, mode, metadata, memory=tuple(memory))
        spec = replace(spec, human_timeout_s=human_timeout_s, batch_api=batch_api)
        spec = with_task(spec, task, prompt, variables)
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
        queue = self.backend.queue(spec.mode)
        message = (  # put with the root where the broker is the store (`root_message`)
            self.backend.root_message(priority) if isinstance(self.backend, SendsWithRoot) else None
        )
        serving = None if queue is None else Serving(queue, chosen, message)
        try:  # the serving check goes with the writes, in one step
            trace = create_root(self.runtime, spec, serving)
        except ConfigError:  # an unserved workspace is said first, whatever else is wrong
            check_served(self.store, queue, chosen)
            raise
        if message is not None and message.sent:
            return Handle(trace.trace_id, self)
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
        cancel_unwatched(self.runtime, ids)  # a tree run inline: no watcher cancels them
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

    def regenerate(self, trace_id: str, after_sequence: int) -> Handle:
        """Run a finished root again from message `after_sequence`, with no new message.

        The model answers that message once more; its earlier answer stays in the trace,
        off the main path (`fleet.conversation.continuation.regenerate`).
        """
        trace = regenerate(self.runtime, trace_id, after_sequence)
        self.backend.enqueue(trace)
        return Handle(trace_id, self, turn_of(trace))

    def compact(self, trace_id: str) -> Compacted:
        """Summarise a finished root's main path now, here (`fleet.loop.compact.compact_now`)."""
        return compact_now(self.runtime, trace_id)

    def reply(self, trace_id: str, answer: str) -> Handle:
        """Answer the question a trace waits on (`ask_human`); it resumes on any worker."""
        trace = human.reply(self.runtime, trace_id, answer)
        self.backend.enqueue(trace)
        return Handle(trace_id, self, turn_of(trace))

    def send(self, trace_id: str, text: str, **options: Any) -> str:
        """Message a running trace (`fleet.conversation.messages.send`); the entry id."""
        return messages.send(self.runtime, trace_id, text, **options).entry_id

    def approve(
        self, trace_id: str, approval_id: str | None = None, digest: str | None = None
    ) -> Handle:
        """Approve the tool call a trace waits on; a worker runs it, then the trace goes on.

        `approval_id` (the call's tool_call_id) and `digest` (of the call as shown), when
        given, must be the pending call's. `ConversationError` when no approval is
        pending, the id or digest differs, or it was answered.
        """
        trace = approval.approve(self.runtime, trace_id, approval_id, digest)
        self.backend.enqueue(trace)
        return Handle(trace_id, self, turn_of(trace))

    def deny(
        self,
        trace_id: str,
        reason: str,
        approval_id: str | None = None,
        digest: str | None = None,
    ) -> Handle:
        """Deny the pending tool call: nothing runs, the model reads `reason`; as `approve`."""
        trace = approval.deny(self.runtime, trace_id, reason, approval_id, digest)
        self.backend.enqueue(trace)
        return Handle(trace_id, self, turn_of(trace))

    @property
    def experiences(self) -> ExperienceStore:
        """The fleet's experiences: `put`, `get`, `all(scope)`, `remove` (`fleet.experiences`)."""
        assert self.runtime.experiences is not None  # Runtime.build always gives one
        return self.runtime.experiences

    @property
    def memory(self) -> MemoryDesk:
        """Long-term memory, on the agents' compare-and-set rules (docs/memory.md)."""
        board = self.runtime.store.capability(MEMORY)
        return MemoryDesk(board, self.runtime.config.memory.caps())

    def reflect(
        self,
        trace_id: str,
        *,
        model: str | None = None,
        timeout_s: float | None = None,
        scope: str | None = None,
        focus: str | None = None,
    ) -> list[Experience]:
        """Run a read-only reflection over a finished tree; store what it proposes, unapproved.

        Unless FLEET_EXPERIENCE_AUTO_APPROVE matches `execution:SCOPE` (the operator's policy).
        Every proposal goes to `scope`, which must be one the tree ran in, by default the
        root's most specific (`fleet.experiences.reflect`): never a scope the model names.
        The reflection runs in the tree's workspace; `focus` says what to look at above all.

        `ConversationError` if the tree has not finished; `TraceNotFound` if there is none;
        `ConfigError` for a scope the tree did not run in.
        """
        handle, chosen = self.start_reflection(trace_id, model=model, scope=scope, focus=focus)
        return self.keep_reflection(trace_id, handle.wait(timeout_s), chosen)

    def start_reflection(
        self,
        trace_id: str,
        *,
        model: str | None = None,
        scope: str | None = None,
        focus: str | None = None,
    ) -> tuple[Handle, str]:
        """Submit the reflection of `reflect` without waiting.

        Returns its handle and the scope its proposals go to (`keep_reflection` stores
        them once it ended).
        """
        from fleet.experiences import reflect

        root = self.store.get_trace(trace_id)
        allowed = reflect.tree_scopes(self.store, trace_id)
        chosen = reflect.check_scope(scope or reflect.default_scope(root), allowed, trace_id)
        task = reflect.reflection_task(self.store, trace_id, focus)
        workspace = Path(root.workspace) if root.workspace else None
        handle = self.submit(task, model=model, preset=reflect.REFLECT_PRESET, workspace=workspace)
        return handle, chosen

    def keep_reflection(self, trace_id: str, done: Trace, scope: str) -> list[Experience]:
        """Store the proposals of a reflection on `trace_id` that ended as `done`."""
        from fleet.experiences import reflect

        policy = self.runtime.settings.experience_auto_approve
        tree = subtree(self.store, trace_id)
        proposed = reflect.proposals(done.answer or "", tree, scope, policy)
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
        """Events of the trace's tree until it finishes (`observe.following.Follower.events`)."""
        return self._follower().events(trace_id, timeout_s, turn=turn, cancel=cancel)

    def wait(self, trace_id: str, timeout_s: float | None = None, *, turn: int = 0) -> Trace:
        """Block until the trace ends, reading its event stream (of run `turn`)."""
        return self._follower().wait(trace_id, timeout_s, turn=turn)

    def _follower(self) -> Follower:
        return Follower(self.store, self.backend.queue, self.runtime.settings.no_worker_timeout_s)
