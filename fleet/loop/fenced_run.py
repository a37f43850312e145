"""One run of a trace under its lease: the loop, writing only through a fenced runtime.

`fleet.loop.runner.Runner` takes the lease and hands a `FencedRun` the runtime fenced by it
(`Runtime.fenced`): every write checks the lease in its Lua script (`LeaseLost`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, assert_never

from fleet import lifecycle
from fleet.batchapi.route import CALL_KEY, consumed, parked_call
from fleet.conversation.fanout import FAN_OUT_MODEL, planned_turn
from fleet.errors import FleetError, HookBlocked, LeaseLost, StopLanded, TransientLLMError
from fleet.history import SUB_AGENT_TOOLS, fresh_call_ids, main_path, recent_calls
from fleet.limits.gate import Spent, Wait, last_answer
from fleet.llm.timing import span_of
from fleet.loop.call import Prepared, prepare
from fleet.loop.compact import compacted
from fleet.loop.cut import CallCut
from fleet.loop.resume import opening
from fleet.loop.route import ask_model
from fleet.loop.steps import (
    CallTools,
    DoomLoop,
    Finish,
    OnApproval,
    OnBatch,
    OnChildren,
    OnPerson,
    OnRemote,
    Step,
    Waiting,
    decide_next,
)
from fleet.loop.structured import Accepted, Correct, Rejected, check_final, schema_for
from fleet.loop.tool_turn import tool_turn
from fleet.loop.turns import (
    Answered,
    GaveUp,
    GoOn,
    Held,
    Outcome,
    ReadAgain,
    Turn,
    hand_back,
    model_message,
    recorded,
    terminal,
)
from fleet.models import Event, Status, Trace, now_ms
from fleet.remote.run import run_remote
from fleet.runstate import RemoteCall
from fleet.runtime import Runtime
from fleet.storage.leases import HeldLease
from fleet.storage.store import TraceSnapshot
from fleet.storage.writes import TraceWrite, WriteExtension


@dataclass(frozen=True)
class Lost:
    """The lease was taken over during the model call: nothing of the turn is written."""


class FencedRun:
    """Drives one trace turn by turn until it finishes, waits, yields or is stopped."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        should_yield: Callable[[], bool] = lambda: False,
        end_step: WriteExtension | None = None,
    ) -> None:
        """A run on `runtime`, already fenced by the run's lease (see `Runner.__init__`)."""
        self.runtime = runtime
        self.store = runtime.store
        self.should_yield = should_yield
        self.end_step = end_step
        self._prepared: Prepared | None = None
        """What every model call of this run takes (`fleet.loop.call`), once it made one."""

    def drive(self, snapshot: TraceSnapshot, held: Held) -> Outcome | Wait:
        """Drive the trace from `snapshot` (read by `begin_run`) until its run ends.

        Raises:
            LeaseLost: a write found the lease taken over; nothing of it was written.
        """
        if snapshot.trace.is_terminal:
            return terminal(snapshot.trace.status)
        hooks = self.runtime.hooks
        hooks.run_started(snapshot.trace)
        try:
            outcome = self._drive_open(snapshot, held)
        except BaseException as exc:
            hooks.run_ended(snapshot.trace, "crashed", exc)
            raise
        hooks.run_ended(snapshot.trace, "throttled" if isinstance(outcome, Wait) else outcome)
        return outcome

    def _drive_open(self, snapshot: TraceSnapshot, held: Held) -> Outcome | Wait:
        start = TraceWrite(snapshot.trace.trace_id, snapshot.trace.root_trace_id)
        trace = lifecycle.start(self.runtime, snapshot.trace, start)  # begin_run did, mostly
        if (ended := self._without_model(trace, start)) is not None:
            return ended
        following = self._opening(snapshot, trace, start, held)
        if not isinstance(following, TraceSnapshot | ReadAgain):
            return following
        held.started_ms = now_ms()
        try:
            return self._loop(trace.trace_id, held, following)
        except LeaseLost:
            raise
        except TransientLLMError as exc:  # the client retried it: the task may, later
            return self._retry_later(trace.trace_id, exc)
        except HookBlocked as exc:  # an operator's hook refused the model call
            return self.finish(trace.trace_id, "stopped", error=exc.reason, reason="hook")
        except CallCut:  # a stop cut a tool in flight (`fleet.loop.cut`): its turn stays open
            return self.finish(trace.trace_id, "stopped", error="stop requested", reason="stop")
        except FleetError as exc:
            return self.finish(trace.trace_id, "failed", error=str(exc), reason="error")
        finally:
            if not held.released:  # a finish in one step wrote its duration already
                with contextlib.suppress(LeaseLost):
                    self.store.add_stats(trace.trace_id, duration_ms=now_ms() - held.started_ms)

    def _opening(
        self, snapshot: TraceSnapshot, trace: Trace, start: TraceWrite, held: Held
    ) -> Outcome | TraceSnapshot | ReadAgain:
        """Where the first turn starts from (`fleet.loop.resume`), or how the run ended."""
        try:
            following = opening(self.runtime, snapshot, trace, start, held)
        except CallCut:  # a stop cut the approved call it runs first: its result not written
            return self.finish(trace.trace_id, "stopped", error="stop requested", reason="stop")
        if isinstance(following, str | TraceSnapshot | ReadAgain):  # a str: a stop landed
            return following
        return self._waiting(following)

    def _without_model(self, trace: Trace, start: TraceWrite) -> Outcome | None:
        """A run that ends before any model call: a bad workspace, or a remote child."""
        try:
            self.runtime.workspace_of(trace)
        except FleetError as exc:  # a forged or stale workspace: fail before any model call
            if start.ops:
                self.store.apply(start)
            return self.finish(trace.trace_id, "failed", error=str(exc), reason="error")
        if trace.mode != "remote":
            return None
        if start.ops:
            self.store.apply(start)
        ran = run_remote(self.runtime, trace, park=self.runtime.dispatcher.children_survive_restart)
        if isinstance(ran, RemoteCall):  # parked where a sweeper polls for it (a task queue)
            return self._waiting(OnRemote(ran.agent, ran.task_id))
        return terminal(ran)

    def _loop(self, trace_id: str, held: Held, following: GoOn) -> Outcome | Wait:
        while True:
            snapshot = (  # trace, messages and stop flag: 1 read
                following if isinstance(following, TraceSnapshot) else self.store.snapshot(trace_id)
            )
            if (ended := self._between_turns(snapshot, held.heartbeat)) is not None:
                return ended
            turn = self._uncut_turn(snapshot, held)
            if not isinstance(turn, Turn):
                return self._no_turn(snapshot, turn)
            went = self._step(held, turn)
            if not isinstance(went, TraceSnapshot | ReadAgain):
                return went
            following = went

    def _step(self, held: Held, turn: Turn) -> Outcome | GoOn:
        """Act on the turn's step: how the run ended, or where it goes on from."""
        match turn.step:
            case Finish(answer=answer, reason=reason):
                return self._answer(held, turn, answer, reason)
            case DoomLoop(call=call, repeats=repeats):
                error = f"doom loop: {call.name!r} called {repeats} times with the same arguments"
                return self._end(held, turn, "failed", error=error, reason="doom_loop")
            case CallTools(calls=calls):
                try:
                    after = tool_turn(self.runtime, turn, calls)
                except StopLanded:  # a spawning turn's own write: nothing of it was written
                    trace_id = turn.trace.trace_id
                    return self.finish(trace_id, "stopped", error="stop requested", reason="stop")
                if isinstance(after, OnPerson | OnApproval | OnChildren):
                    return self._waiting(after)
                return after
            case OnPerson() | OnApproval() | OnBatch() | OnChildren() | OnRemote():
                return self._waiting(turn.step)
            case _:
                assert_never(turn.step)

    def _waiting(self, waits: Waiting) -> Outcome:
        """The run ends, its trace `waiting` (written by whoever put it there), no slot held."""
        match waits:
            case OnPerson() | OnApproval() | OnChildren():
                return "waiting"
            case OnBatch() | OnRemote():  # `waiting` too, which a runner must not run again
                return "parked"
            case _:
                assert_never(waits)

    def _uncut_turn(
        self, snapshot: TraceSnapshot, held: Held
    ) -> Turn | Wait | Spent | OnBatch | Lost | Outcome:
        """`_turn`, or how a stop ended the trace (`fleet.loop.cut`): nothing cut is written.

        An interrupting message cuts the call and the turn is asked again at once: its
        injection gives the message in full.
        """
        trace_id = snapshot.trace.trace_id
        while True:
            try:
                turn = self._turn(snapshot, held)
            except CallCut as cut:
                if cut.reason == "stop":
                    return self.finish(trace_id, "stopped", error="stop requested", reason="stop")
                if held.pending is None:  # else nothing was written: the snapshot stands
                    snapshot = self.store.snapshot(trace_id)
                snapshot = replace(snapshot, inbox=None)  # the interrupt came after its read
                continue
            if isinstance(turn, Turn):
                self._refused_if_stopped(turn)
            return turn

    def _refused_if_stopped(self, turn: Turn) -> None:
        """A stop that landed as the call returned: the children it asks for are dropped.

        Asked for a turn that would start children (no child is created after a stop
        landed) by its own write, stored before its tools run: refused whole then
        (`StopLanded`, `_step`), with no read of its own. A turn that ends the trace asks
        in its own write too (`_end`), and the cut (`fleet.loop.cut`) covers the call itself.
        """
        match turn.step:
            case CallTools(calls=calls) if any(c.name in SUB_AGENT_TOOLS for c in calls):
                turn.write.refused_if_stopped()
            case _:
                pass

    def _between_turns(self, snapshot: TraceSnapshot, heartbeat: HeldLease) -> Outcome | None:
        """Lease lost, yield, stop or max_iterations end the run here; None goes on."""
        trace = snapshot.trace
        max_iterations = self.runtime.preset(trace.preset).max_iterations
        if heartbeat.lost.is_set():
            return "lost"
        if self.should_yield():
            lifecycle.requeue(self.runtime, trace)
            return "yielded"
        if snapshot.stop_requested:
            return self.finish(trace.trace_id, "stopped", error="stop requested", reason="stop")
        if trace.iteration >= max_iterations:
            error = f"stopped after max_iterations={max_iterations}"
            return self.finish(trace.trace_id, "failed", error=error, reason="max_iterations")
        return None

    def _retry_later(self, trace_id: str, exc: TransientLLMError) -> Outcome | Wait:
        """A provider error the client's retries did not fix: queued again, or failed."""
        match hand_back(self.runtime, trace_id, exc):
            case Wait() as wait:
                return wait
            case GaveUp(error=error):
                return self.finish(trace_id, "failed", error=error, reason="error")
            case unreachable:
                assert_never(unreachable)

    def _no_turn(
        self, snapshot: TraceSnapshot, why: Wait | Spent | OnBatch | Lost | Outcome
    ) -> Outcome | Wait:
        """No model call this time; what happens instead.

        Lease lost: let go. A limit said "not now": queued again, to come back later. The
        tree's budget is spent: end with what we have. Parked in a provider batch: wait. A
        stop cut the call: the trace ended so.
        """
        match why:
            case Lost():
                return "lost"
            case Wait(retry_in_s=retry_in_s, reason=reason):
                lifecycle.requeue(self.runtime, snapshot.trace, reason, retry_in_s)
                return why
            case Spent(reason=reason):
                partial = last_answer(main_path(snapshot.messages, snapshot.trace.head_sequence))
                ended = lifecycle.stop_for_budget(self.runtime, snapshot.trace, partial, reason)
                return terminal(ended.status)
            case OnBatch():
                return self._waiting(why)
            case str():  # a stop cut the call (`_uncut_turn`): the trace ended
                return why
            case _:
                assert_never(why)

    def _turn(self, snapshot: TraceSnapshot, held: Held) -> Turn | Wait | Spent | OnBatch | Lost:
        """One model call and what to do about it; the turn is not written yet.

        `Lost` when the lease was lost during the model call: another runner may own the
        trace now, so nothing of this turn is written and no tool runs. `Wait` when a
        provider limit did not admit the call, `Spent` when the tree's budget is used up:
        nothing of this turn is written either. `OnBatch`: the call went into a provider
        batch (`fleet.batchapi`), and the trace waits on it.
        """
        model_name = self.runtime.model_name(snapshot.trace.model, snapshot.trace.preset)
        answered = self._ask(snapshot, held, model_name)
        if not isinstance(answered, Answered):
            return answered
        if held.heartbeat.lost.is_set():
            return Lost()
        return self._next_turn(answered, held, model_name)

    def _ask(
        self, snapshot: TraceSnapshot, held: Held, model_name: str
    ) -> Answered | Wait | Spent | OnBatch:
        """The turn's answer: a fan-out root's planned turn, else the model's (or why not)."""
        trace = snapshot.trace
        path = main_path(snapshot.messages, trace.head_sequence)
        planned = planned_turn(trace, path)  # a fan-out root's turns need no model
        if planned is not None:
            return Answered(trace, snapshot.messages, path, planned, FAN_OUT_MODEL)
        if held.pending is None:  # past `context_threshold` of a `compact` alias: summarise
            snapshot = compacted(self.runtime, snapshot, model_name) or snapshot
        if self._prepared is None or self._prepared.model_name != model_name:
            self._prepared = prepare(self.runtime, trace, model_name)
        return ask_model(self._prepared, snapshot, held)

    def _next_turn(self, answered: Answered, held: Held, model_name: str) -> Turn:
        """The answer as the turn to write (with what is pending) and the step it decides."""
        trace, messages = answered.trace, answered.messages
        response = fresh_call_ids(answered.response, messages, trace.last_sequence + 1)
        message = model_message(self.runtime, trace, response, answered.model)
        tools = [c["function"]["name"] for c in message.tool_calls or ()]
        data = {"role": "assistant", "tools": tools, **span_of(message)}
        event = Event(kind="message", trace_id=trace.trace_id, data=data)
        write, held.pending = held.pending or TraceWrite(trace.trace_id, trace.root_trace_id), None
        if answered.batched:  # the answer is in the trace now (`fleet.batchapi.route`)
            message.metadata[CALL_KEY] = (
                parked.custom_id if (parked := parked_call(trace)) else None
            )
            trace = trace.with_run(waiting_on_batch=consumed(trace))
            write.update_run(waiting_on_batch=consumed(trace))
        if response.batch_id:
            message.metadata["batch_id"] = response.batch_id
        write.append(message, event, iteration=trace.iteration + 1)
        repeats = self.runtime.settings.doom_loop_repeats
        step: Step = decide_next(response, recent_calls(answered.path, repeats - 1), repeats)
        if answered.final:  # the root's last turn: whatever it says is the answer
            step = Finish(response.content or "(no answer)", reason="budget")
        pauses = self.runtime.gate.pauses_for(model_name, trace.root_trace_id)  # the next call's
        return Turn(step, recorded(trace, message), [*messages, message], write, pauses)

    def _answer(self, held: Held, turn: Turn, answer: str, reason: str) -> Outcome | ReadAgain:
        """Finish with the answer; read again after a correction (it missed its output schema).

        The budget's last turn stands as it is: there is no budget left to correct it.
        """
        preset = self.runtime.preset(turn.trace.preset)
        schema = schema_for(preset.output_schema, preset.name, turn.trace)
        path = main_path(turn.messages, turn.trace.head_sequence)
        answered = self.runtime.redactor.values_only(answer)
        checked = (
            Accepted(None)
            if reason == "budget"
            else check_final(schema, turn.trace, answered, path)
        )
        match checked:
            case Accepted(output=output):
                outcome = {"answer": answer, "output": output, "reason": reason}
                return self._end(held, turn, "completed", **outcome)
            case Rejected(error=error):
                outcome = {"answer": answer, "error": error, "reason": "output_schema"}
                return self._end(held, turn, "failed", **outcome)
            case Correct(message=message):
                self.store.apply(turn.write)
                data = {"role": "user", "correction": True}
                event = Event(kind="message", trace_id=turn.trace.trace_id, data=data)
                self.store.record_turn(turn.trace.root_trace_id, message, event)
                return ReadAgain()
            case _:
                assert_never(checked)

    def _end(self, held: Held, turn: Turn, status: Status, **outcome: Any) -> Outcome:
        """The last model turn, the finish, the duration and the lease's release: one step.

        Refused whole if a stop landed as the last call returned (`StopLanded`: the stop
        flag is read in that step, not by a read of its own): the answer is dropped and
        the trace ends `stopped`.
        """
        duration_ms = now_ms() - held.started_ms
        turn.write.refused_if_stopped()
        turn.write.add_stats(duration_ms=duration_ms)
        turn.write.release_lease(held.owner)
        if self.end_step is not None and not self.end_step.applied:
            turn.write.extend(self.end_step)
        stats = turn.trace.stats
        stats = stats.model_copy(update={"duration_ms": stats.duration_ms + duration_ms})
        trace = turn.trace.model_copy(update={"stats": stats})  # as the write leaves it
        held.released = True  # before the write: a heartbeat meanwhile finds it gone, rightly
        try:
            lifecycle.finish(
                self.runtime, trace.trace_id, status, trace=trace, write=turn.write, **outcome
            )
        except StopLanded:  # nothing was written: the lease is still ours
            held.released = False
            return self.finish(trace.trace_id, "stopped", error="stop requested", reason="stop")
        except BaseException:
            held.released = False
            raise
        return terminal(status)

    def finish(
        self,
        trace_id: str,
        status: Status,
        *,
        answer: str | None = None,
        error: str | None = None,
        reason: str,
    ) -> Outcome:
        """End the run in a terminal status (see `lifecycle.finish`)."""
        lifecycle.finish(self.runtime, trace_id, status, answer=answer, error=error, reason=reason)
        return terminal(status)
