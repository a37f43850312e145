"""A model call a stop or an interrupting message cuts short, within ~100 ms.

The process's one watcher (`CallWatcher`, a daemon thread per store) looks, every `POLL_S`,
at the calls in flight: the trace's stop flag raised, or an interrupting message in its
inbox (`fleet.conversation.messages`). When it finds one it cancels the call's handle
(`fleet.llm.cancel`) and wakes the run. Then the run goes on at once (`CallCut`): a stop
ends the trace `stopped`, an interrupt starts the next turn with the message. The cut
call's answer, should it come, is dropped: nothing of it is written, no tool of it runs,
no child of it is created. Its booking is settled with the estimate it was booked with
(the provider bills the prompt it read), once. A call that answered before the cut landed
is kept.

A model call whose client ends at once when its handle is cancelled
(`LLMClient.ends_on_cancel`: the HTTP clients, whose connections the handle shuts down,
`fleet.llm.transport`; the scripted model, whose latency waits on the handle) runs in the
run's own thread: the cancel makes it fail (`CallCancelled`, or the error of a socket shut
under it), and the run raises `CallCut` instead. No thread is handed the call: that hop
cost 1.6-2.1 ms per call (docs/performance.md). Any other call (a test's client, a tool)
runs in another thread (a spare one: `SpareThreads`) while the run's thread waits for its
answer or the watcher's wake, whichever comes first; a cut abandons it, and its thread ends
when the call returns (an HTTP one at once: its handle is cancelled too). A watcher that
cannot read the store (Redis away) cuts nothing: the call ends as it would have without it.
A new connection's DNS lookup and TCP connect, which no shutdown can cut, run in a thread
the cut abandons (`fleet.llm.transport`): once per connection, not per call.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Literal, TypeVar
from weakref import WeakKeyDictionary

from fleet.errors import FleetError
from fleet.limits.gate import Go
from fleet.llm.base import LLMResponse, Usage
from fleet.llm.cancel import Cancel, bind, cancelling
from fleet.runtime import Runtime
from fleet.storage.inbox import INBOX, Inbox
from fleet.storage.store import StopsAndWaits
from fleet.storage.writes import InboxSeen

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_S = 0.1
"""How often the watcher looks at the stop flags and inboxes of the calls in flight."""
CutReason = Literal["stop", "interrupt"]


class CallCut(FleetError):
    """The model call in flight was cut: the trace was stopped, or a message interrupts."""

    def __init__(self, reason: CutReason) -> None:
        """Cut for `reason`."""
        super().__init__(f"model call cut: {reason}")
        self.reason: CutReason = reason


@dataclass
class Watch:
    """One call in flight: what the watcher looks at and how it wakes the run."""

    trace_id: str
    seen: str | None
    """The inbox's newest entry when the call left: only later messages interrupt."""
    interrupts: bool = True
    """An interrupting message cuts it too (a model call; a tool is cut by a stop only)."""
    wake: threading.Event = field(default_factory=threading.Event)
    reason: CutReason | None = None
    cancel: Cancel | None = None
    """The call's cancel handle: the watcher's cut cancels it (`fleet.llm.cancel`); None for
    a call that has nothing a cancel could end (a test's client that opens no connection)."""


class CallWatcher:
    """The calls in flight of one store, looked at every `POLL_S` by one daemon thread.

    The thread runs only while some call is watched, so an idle process keeps none.
    """

    def __init__(self, stops: StopsAndWaits, inbox: Inbox) -> None:
        """Watch through `stops` (the stop flags) and `inbox`."""
        self._stops, self._inbox = stops, inbox
        self._by_id: dict[int, Watch] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(
        self,
        trace_id: str,
        *,
        interrupts: bool = True,
        seen: InboxSeen | None = None,
        cancellable: bool = True,
    ) -> Iterator[Watch]:
        """Watch the trace while the block runs its model call (or tool).

        `seen`: the inbox entry later messages are counted from, as the run read it in a
        round trip it made anyway; None: read here (interrupts only). `cancellable`: the
        call is given a cancel handle (False: it opens no connection to close).
        """
        newest = seen.newest if seen is not None else None
        if interrupts and seen is None:
            newest = self._inbox.newest(trace_id)
        watch = Watch(trace_id, newest, interrupts, cancel=Cancel() if cancellable else None)
        with self._lock:
            self._by_id[id(watch)] = watch
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="fleet-call-watch", daemon=True
                )
                self._thread.start()
        try:
            yield watch
        finally:
            with self._lock:
                self._by_id.pop(id(watch), None)

    def _loop(self) -> None:
        # A look first waits a poll: a call's run read the stop flag and inbox as it left,
        # and a call shorter than a poll is never looked at (no read of the store at all).
        while True:
            threading.Event().wait(POLL_S)
            with self._lock:
                watches = list(self._by_id.values())
                if not watches:
                    self._thread = None
                    return
            for watch in watches:
                if watch.reason is None:  # a cut one is not read again
                    self._look(watch)

    def _look(self, watch: Watch) -> None:
        try:
            if self._stops.stop_requested(watch.trace_id):
                watch.reason = "stop"
            elif watch.interrupts and self._interrupted(watch):
                watch.reason = "interrupt"
        except Exception:  # a store away: the call ends as it would have without the watcher
            log.debug("call watch of %r could not read the store", watch.trace_id, exc_info=True)
            return
        if watch.reason is not None:
            if watch.cancel is not None:  # reason first: the run reads it when the call fails
                watch.cancel.cancel()
            watch.wake.set()

    def _interrupted(self, watch: Watch) -> bool:
        return any(e.posted.interrupt for e in self._inbox.after(watch.trace_id, watch.seen, 20))


_WATCHERS: WeakKeyDictionary[object, CallWatcher] = WeakKeyDictionary()
_WATCHERS_LOCK = threading.Lock()


def watcher(anchor: object, stops: StopsAndWaits, inbox: Inbox) -> CallWatcher:
    """The one watcher of `anchor` (a runtime's lease keeper: its fenced copies share it)."""
    with _WATCHERS_LOCK:
        found = _WATCHERS.get(anchor)
        if found is None:
            found = _WATCHERS[anchor] = CallWatcher(stops, inbox)
        return found


class SpareThreads:
    """Daemon threads that run calls, each kept for the next call once its own ended.

    Starting a thread and waiting for it to run cost ~0.15 ms (~60 us of it CPU) more than
    handing a call to an idle one, per call: a call takes an idle thread when there is one,
    else starts one. A cut call's thread
    stays busy until that call ends on its own (never waited for); a thread idle for
    `IDLE_S` ends, so an idle process keeps none.
    """

    IDLE_S = 30.0

    def __init__(self) -> None:
        """None yet."""
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def run(self, work: Callable[[], None]) -> None:
        """Start `work()` on an idle thread, or a new one; return at once."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name="fleet-call", daemon=True
            ).start()
        inbox.put(work)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            try:
                work = inbox.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # else a caller took it and is handing work
                        self._idle.remove(inbox)
                        return
                continue
            work()
            del work  # the call's closure is not kept while idle
            with self._lock:
                self._idle.append(inbox)


_SPARE = SpareThreads()


def cuttable(watch: Watch, call: Callable[[], T], *, in_place: bool = False) -> T:
    """`call()`, raising `CallCut` as soon as the watcher finds a reason to cut it.

    `in_place`: the call ends at once when `watch.cancel` is cancelled (its client's
    `ends_on_cancel`): it runs in this thread. Else in another thread, in a copy of this
    context (a tracing span's parent goes with it), as the call `watch.cancel` cancels.
    """
    if in_place and watch.cancel is not None:
        return _in_place(watch, watch.cancel, call)
    box: dict[str, object] = {}
    context = contextvars.copy_context()

    cancel = watch.cancel

    def target() -> None:
        if cancel is not None:
            context.run(bind, cancel)
        try:
            box["value"] = context.run(call)
        except BaseException as exc:  # handed to the run's thread, raised there
            box["error"] = exc
        finally:
            if cancel is not None:
                cancel.release()
            watch.wake.set()

    _SPARE.run(target)
    watch.wake.wait()
    if "value" not in box and "error" not in box:
        assert watch.reason is not None
        raise CallCut(watch.reason)  # the watcher cancelled the handle: its thread ends
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def _in_place(watch: Watch, cancel: Cancel, call: Callable[[], T]) -> T:
    """`call()` in this thread as the call `cancel` cuts; its failure once cut is the cut.

    An answer is kept even if the cut landed as it came: the call had ended.
    """
    try:
        with cancelling(cancel):
            return call()
    except Exception:
        if cancel.cancelled and watch.reason is not None:
            raise CallCut(watch.reason) from None
        raise


def runtime_watcher(runtime: Runtime) -> CallWatcher:
    """The runtime's process-wide watcher (its fenced copies share it)."""
    store = runtime.store
    anchor = runtime.leases if runtime.leases is not None else store
    return watcher(anchor, store, store.capability(INBOX))


def call_watch(
    runtime: Runtime, trace_id: str, *, interrupts: bool = True, seen: InboxSeen | None = None
) -> AbstractContextManager[Watch]:
    """Watch `trace_id` on the runtime's process-wide watcher while a call is in flight."""
    return runtime_watcher(runtime).watching(trace_id, interrupts=interrupts, seen=seen)


def stoppable(runtime: Runtime, trace_id: str, call: Callable[[], T]) -> T:
    """A tool's `call()`, cut by a stop (`CallCut("stop")`); a message waits for the model.

    The cut tool runs on in its thread to its own time limit (`tool_timeout_s`, bash's
    timeout): the run does not wait for it, and nothing of it is written.
    """
    with call_watch(runtime, trace_id, interrupts=False) as watch:
        return cuttable(watch, call)


def estimated(go: Go) -> LLMResponse:
    """What a cut call is settled with: the prompt it was booked with, no answer."""
    return LLMResponse(content=None, usage=Usage(prompt_tokens=go.est_tokens))
