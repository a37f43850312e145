"""A whole agent tree in this process: `InProcessFleet` and its `InProcessDispatcher`.

The remote counterpart is `fleet.client.Fleet` (a running Celery fleet). The `Dispatcher`
Protocol lives in `fleet.runtime`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, assert_never

from fleet.children import after
from fleet.conversation import approval, human
from fleet.conversation.continuation import continue_trace, regenerate
from fleet.conversation.fanout import fan_out_task
from fleet.conversation.prompts import with_task
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import TraceNotFound
from fleet.lifecycle import stop_subtree
from fleet.lifecycle.recorder import recorder_id, wants_recorder
from fleet.llm.base import LLMClient
from fleet.loop.runner import Runner, run_to_end
from fleet.memory.board import MEMORY
from fleet.memory.desk import MemoryDesk
from fleet.models import Trace
from fleet.observe.operator import build_hooks
from fleet.remote.run import cancel_unwatched
from fleet.runtime import Dispatcher, Runtime, SpawnRequest
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.store import TraceStore
from fleet.tools.imagesource import load_images


class InProcessDispatcher:
    """Runs children in this process: explore branches concurrently in threads."""

    children_survive_restart = False

    def __init__(self, max_parallel: int = 16) -> None:
        """`max_parallel` caps the threads of one explore."""
        self.max_parallel = max_parallel

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        """Run every child to its end, then collect them into the parent."""
        runner = Runner(runtime)
        ids = list(request.child_ids)
        width = min(len(ids), self.max_parallel, _max_concurrent(runtime, request.root_trace_id))
        if width == 1:
            for child in ids:
                run_to_end(runner, child)
        else:
            with ThreadPoolExecutor(width, "fleet-branch") as pool:
                list(pool.map(lambda child: run_to_end(runner, child), ids))
        call = after.Call(request.parent_trace_id, request.tool_call_id)
        apply_after_child(after.settle_call(runtime, call, ids, "inline"))


class InProcessFleet:
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
    ) -> InProcessFleet:
        """In-memory store unless `redis` (FLEET_REDIS_URL) or a store is given."""
        if store is None:
            store = _redis_store(settings) if redis else MemoryStore()
        runtime = Runtime.build(
            settings,
            store,
            dispatcher or InProcessDispatcher(),
            clients=clients,
            hooks=build_hooks(settings, store),
        )
        return cls(runtime)

    def run(
        self,
        task: str | None = None,
        *,
        model: str | None = None,
        preset: str = "default",
        metadata: Mapping[str, Any] | None = None,
        images: Sequence[str | Path] = (),
        memory: Sequence[str] = (),
        human_timeout_s: int | None = None,
        prompt: Path | None = None,
        variables: Mapping[str, str] | None = None,
    ) -> Trace:
        """Create a root trace, run it until it ends or waits on a person, return it.

        `images`: file paths or http(s) URLs shown to the model with the task; `metadata`:
        the caller's own, kept as it is; `human_timeout_s`: how long a wait on a person lasts;
        `memory`: the long-term memory namespaces the tree may use; `prompt` and
        `variables`: a prompt file in place of `task` (as `Fleet.submit`).
        """
        loaded = load_images(images, web_allow=self.runtime.settings.web_allow)
        spec = TaskSpec(
            task="",
            model=model,
            preset=preset,
            metadata=metadata,
            images=loaded,
            memory=tuple(memory),
            human_timeout_s=human_timeout_s,
        )
        spec = with_task(spec, task, prompt, variables)
        trace = create_root(self.runtime, spec)
        return self._run(trace.trace_id)

    def explore(
        self, tasks: Sequence[str], *, model: str | None = None, preset: str = "explore"
    ) -> Trace:
        """One tree exploring `tasks` (a fan-out root, `fleet.conversation.fanout`), run."""
        chosen = tuple(tasks)
        spec = TaskSpec(fan_out_task(chosen), model, fan_out=chosen, fan_out_preset=preset)
        trace = create_root(self.runtime, spec)
        return self._run(trace.trace_id)

    @property
    def memory(self) -> MemoryDesk:
        """Long-term memory, as `Fleet.memory` (docs/memory.md)."""
        board = self.runtime.store.capability(MEMORY)
        return MemoryDesk(board, self.runtime.config.memory.caps())

    def continue_trace(
        self, trace_id: str, message: str, after_sequence: int | None = None
    ) -> Trace:
        """Continue a finished root with `message` (after message `after_sequence`), run it."""
        continue_trace(self.runtime, trace_id, message, after_sequence)
        return self._run(trace_id)

    def regenerate(self, trace_id: str, after_sequence: int) -> Trace:
        """Run a finished root again from message `after_sequence` (no new message)."""
        regenerate(self.runtime, trace_id, after_sequence)
        return self._run(trace_id)

    def reply(self, trace_id: str, answer: str) -> Trace:
        """Answer the question a trace waits on and run it on."""
        human.reply(self.runtime, trace_id, answer)
        return self._run(trace_id)

    def approve(
        self, trace_id: str, approval_id: str | None = None, digest: str | None = None
    ) -> Trace:
        """Approve the tool call a trace waits on; run it and the trace on."""
        approval.approve(self.runtime, trace_id, approval_id, digest)
        return self._run(trace_id)

    def deny(
        self,
        trace_id: str,
        reason: str,
        approval_id: str | None = None,
        digest: str | None = None,
    ) -> Trace:
        """Deny the tool call a trace waits on (the model reads `reason`); run the trace on."""
        approval.deny(self.runtime, trace_id, reason, approval_id, digest)
        return self._run(trace_id)

    def stop(self, trace_id: str) -> list[str]:
        """Stop a trace and its subtree (as `Fleet.stop`); the ids told to stop.

        A running trace stops at its next look (a model call or tool in flight is cut);
        a remote child waiting on a person has its remote task cancelled here, since no
        worker's watcher follows it in this process (`fleet.remote.run.cancel_unwatched`).
        """
        ids = stop_subtree(self.runtime, trace_id)
        cancel_unwatched(self.runtime, ids)
        return ids

    def _run(self, trace_id: str) -> Trace:
        run_to_end(Runner(self.runtime), trace_id)
        trace = self.store.get_trace(trace_id)
        self._record(trace)
        return trace

    def _record(self, root: Trace) -> None:
        """Run the recorder the root's end queued (`fleet.lifecycle.recorder`), if any.

        In one process there is no sweeper to send it: it runs here, after the root's
        answer was written, before `run` returns (a fleet runs it on another worker).
        """
        if not wants_recorder(self.runtime, root):
            return
        try:
            recorder = self.store.get_trace(recorder_id(root))
        except TraceNotFound:
            return
        if recorder.status == "queued":
            run_to_end(Runner(self.runtime), recorder.trace_id)


def apply_after_child(action: after.AfterChild) -> None:
    """The in-process host of the after-child policy (`fleet.children.after`).

    The parent's runner called `dispatch` and goes on when it returns: on `Resume` it finds
    its turn complete and runs the next one (`Runner.run` looks again), on `Nothing` it
    waits (a child waiting on a person is healed when the parent runs on). No sweeper runs
    in this process, so the policy never defers an `inline` settlement.
    """
    match action:
        case after.Resume() | after.Nothing():
            return
        case after.Defer():
            raise AssertionError(f"an in-process settlement cannot be deferred: {action!r}")
        case _:
            assert_never(action)


def _max_concurrent(runtime: Runtime, root_trace_id: str) -> int:
    """The tree's `max_concurrent` (its schedule), or no cap: how many branches run at once."""
    schedule = runtime.trees.schedule(root_trace_id) if runtime.trees is not None else None
    return (schedule.max_concurrent if schedule is not None else None) or 1_000_000


def _redis_store(settings: Settings) -> TraceStore:
    from fleet.storage.backends.redis.store import RedisStore

    store = RedisStore.from_url(
        settings.redis_url, settings.redis_sentinel_master, cluster=settings.redis_cluster
    )
    store.ping()
    return store
