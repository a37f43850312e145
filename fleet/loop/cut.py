"""A model call a stop or an interrupting message cuts short, within ~100 ms.

The call runs in a thread of its own while the run's thread waits for whichever comes
first: its answer, or the process's one watcher (`CallWatcher`, a daemon thread per store)
finding, every `POLL_S`, the trace's stop flag raised or an interrupting message in its
inbox (`fleet.conversation.messages`). Then the run goes on at once (`CallCut`): a stop
ends the trace `stopped`, an interrupt starts the next turn with the message. The cut
call's answer, should it come, is dropped: nothing of it is written, no tool of it runs,
no child of it is created. Its booking is settled with the estimate it was booked with
(the provider bills the prompt it read), once.

The provider's connection is not closed: the abandoned request ends in its own thread
when the provider answers or the client's timeout passes. A watcher that cannot read the
store (Redis away) cuts nothing: the call ends as it would have without it.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Literal, TypeVar
from weakref import WeakKeyDictionary

from fleet.errors import FleetError
from fleet.limits.gate import Go
from fleet.llm.base import LLMResponse, Usage
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
        self, trace_id: str, *, interrupts: bool = True, seen: InboxSeen | None = None
    ) -> Iterator[Watch]:
        """Watch the trace while the block runs its model call (or tool).

        `seen`: the inbox entry later messages are counted from, as the run read it in a
        round trip it made anyway; None: read here (interrupts only).
        """
        newest = seen.newest if seen is not None else None
        if interrupts and seen is None:
            newest = self._inbox.newest(trace_id)
        watch = Watch(trace_id, newest, interrupts)
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


def cuttable(watch: Watch, call: Callable[[], T]) -> T:
    """`call()` in its own thread; `CallCut` as soon as the watcher finds a reason.

    The thread runs in a copy of this context (a tracing span's parent goes with it).
    """
    box: dict[str, object] = {}
    context = contextvars.copy_context()

    def target() -> None:
        try:
            box["value"] = context.run(call)
        except BaseException as exc:  # handed to the run's thread, raised there
            box["error"] = exc
        finally:
            watch.wake.set()

    threading.Thread(target=target, name=f"fleet-call-{watch.trace_id[-24:]}", daemon=True).start()
    watch.wake.wait()
    if "value" not in box and "error" not in box:
        assert watch.reason is not None
        raise CallCut(watch.reason)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


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
