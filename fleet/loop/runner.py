"""The agent loop's host side: one runner for main agents and sub-agents, anywhere.

`Runner.run` takes the trace's lease and hands the loop (`fleet.loop.fenced_run.FencedRun`)
a runtime fenced by it; `run_safely` and `run_to_end` are what task and in-process hosts
call.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from fleet import lifecycle
from fleet.children import settling
from fleet.errors import LeaseLost, NewerRecord, TraceNotFound
from fleet.lifecycle import recorder
from fleet.limits.gate import Wait
from fleet.loop.fenced_run import FencedRun
from fleet.loop.turns import Held, Outcome
from fleet.loop.turns import RunResult as RunResult  # re-exported: hosts import it from here
from fleet.runtime import Runtime
from fleet.storage.store import TraceSnapshot
from fleet.storage.writes import WriteExtension

log = logging.getLogger(__name__)

NEWER_RECORD_RETRY_S = 30.0
"""How long a run this release cannot read waits before it is offered again (a worker of the
newer release, during an upgrade, takes it meanwhile; after a rollback it waits here)."""

_HOST = socket.gethostname()


class Runner:
    """Runs a trace until it finishes, waits on sub-agents, or is stopped."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        should_yield: Callable[[], bool] = lambda: False,
        end_step: WriteExtension | None = None,
    ) -> None:
        """Create a runner.

        Args:
            runtime: The shared infrastructure.
            should_yield: Checked between turns; when true the run stops, its trace goes back
                to `queued` and `run` returns `yielded` so the host can re-enqueue it.
            end_step: The host's own step (a registered write extension), run in the
                write that ends the trace (`WriteExtension.applied` tells the host whether
                it ran there).
        """
        self.runtime = runtime
        self.store = runtime.store
        self.should_yield = should_yield
        self.end_step = end_step

    def run(self, trace_id: str) -> RunResult:
        """Run under the trace's lease; a duplicate delivery of a live trace returns `busy`."""
        owner = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"  # which process holds it
        while True:
            ttl_ms = self.runtime.settings.lease_ttl_ms
            start = replace(  # with the experiences' version the process holds them at
                lifecycle.starting(trace_id, self.runtime.shows_experiences),
                experiences_held=self.runtime.experiences_held(),
            )
            pauses = self.runtime.gate.known_pauses(start.root_trace_id)
            snapshot = self.store.begin_run(trace_id, owner, ttl_ms, start, pauses)
            if snapshot is None:
                return RunResult(trace_id, "busy")
            self.runtime.began(snapshot)
            with self.runtime.lease_keeper().hold(trace_id, owner) as lease:
                held = Held(owner, lease)
                try:
                    outcome = self._fenced(snapshot, held)
                except Exception as exc:
                    # Unreachable store: keep the lease (and the running index entry) so
                    # that it lapses and a sweeper resumes the trace once the store is back.
                    if not held.released and not self.store.unavailable(exc):
                        self.store.release_lease(trace_id, owner)
                    raise
                if not held.released:
                    self.store.release_lease(trace_id, owner)
            if outcome == "completed":  # memory's recorder: a tree of its own, after this one
                recorder.after_root(self.runtime, trace_id, lifecycle.queue_root)
            if isinstance(outcome, Wait):
                return RunResult(trace_id, "throttled", outcome.retry_in_s)
            # A collect that finished while we held the lease could not resume us: look again.
            if outcome != "waiting" or not settling.turn_complete(self.store, trace_id):
                return RunResult(trace_id, outcome)

    def _fenced(self, snapshot: TraceSnapshot, held: Held) -> Outcome | Wait:
        """Drive the trace writing only through a store fenced by our lease.

        Every write checks the lease inside its Lua script, so a runner that comes back
        from a freeze after its lease was taken over writes nothing (`LeaseLost`): `lost`.
        """
        trace_id = snapshot.trace.trace_id
        fenced = self.runtime.fenced(trace_id, held.owner)
        run = FencedRun(fenced, should_yield=self.should_yield, end_step=self.end_step)
        try:
            return run.drive(snapshot, held)
        except LeaseLost:
            log.warning("run of %r stopped: its lease was taken over", trace_id)
            held.released = True  # not ours to release any more
            return "lost"


def run_safely(runner: Runner, trace_id: str) -> RunResult:
    """Run a child and never raise: an unexpected error marks the trace failed instead.

    Branch tasks use this so the chord body always runs and siblings are never lost.
    """
    try:
        return runner.run(trace_id)
    except NewerRecord as exc:  # during an upgrade: a worker of the newer release runs it
        log.warning("run of %r handed back: %s", trace_id, exc)
        return RunResult(trace_id, "throttled", retry_in_s=NEWER_RECORD_RETRY_S)
    except Exception as exc:  # the envelope *is* the error handling for branches
        if runner.store.unavailable(exc):
            log.warning("run of %r interrupted, the store is unreachable: %s", trace_id, exc)
            return RunResult(trace_id, "interrupted")
        if isinstance(exc, TraceNotFound) and _gone(runner, trace_id):
            log.warning("run of %r dropped: the trace has no record (%s)", trace_id, exc)
            return RunResult(trace_id, "gone")
        log.exception("run of %r crashed", trace_id)
        error = f"{type(exc).__name__}: {exc}"
        lifecycle.fail(runner.runtime, trace_id, error=error, reason="crash")
        return RunResult(trace_id, "failed")


def _gone(runner: Runner, trace_id: str) -> bool:
    """Whether the trace has no record now (not: the store cannot say)."""
    try:
        runner.store.get_trace(trace_id)
    except TraceNotFound:
        return True
    except Exception:  # the store is away again: not known to be gone, so it is a crash
        return False
    return False


def run_to_end(runner: Runner, trace_id: str) -> RunResult:
    """`run_safely` for in-process hosts: a throttled run sleeps out its wait and goes on.

    Only for threads that are not worker slots (inline runs, the in-process dispatcher).
    """
    while True:
        result = run_safely(runner, trace_id)
        if result.outcome != "throttled":
            return result
        time.sleep(result.retry_in_s)
