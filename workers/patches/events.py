"""Two patches of Celery's events: a worker's task events in batches; a cheaper shown result.

Written and tested against Celery 5.7.0 and kombu 5.7.0 (pyproject pins `celery>=5.7,<5.8`).
`workers.events.RedactingDispatcher` (the app's dispatcher: every event redacted, which is
not a patch and cannot be switched off) is built on `BatchingDispatcher` here.

**`event-batching`: batched.** A worker buffers its task events and Celery publishes the
buffer (one `task.multi` message) on the next turn of the event loop: with a hundred threads
finishing tasks, that was a PUBLISH, a JSON envelope and a kombu message for every one or
two events, about a tenth of a busy worker's CPU. Here the loop publishes at most every
`EVENT_FLUSH_INTERVAL_S` (sooner when EVENT_BUFFER_LIMIT events wait); a flush
asked for earlier is put off with a timer of the worker's event loop, so no event waits
longer than that, and closing the dispatcher (shutdown, reconnect) publishes what waits.
Flower and every other event consumer see the same events, at most that much later.
A worker sending a chord header (`workers.app.one_pipeline`) holds the header's task-sent
events the same way: one message per SENT_EVENTS_PER_MESSAGE instead of one per task.
Relies on `celery.events.dispatcher.EventDispatcher`: its `on_send_buffered` and
`buffer_limit` arguments, `flush(errors, groups)`, `buffer_group`, `_group_buffer` (type ->
events), `_prepare_event(type, fields, blind)`, `_publish(event, producer, routing_key)`,
`mutex`, and `publish(type, fields, producer, **kwargs)` being what `send_task` calls for a
task-sent event (through `app.amqp._event_dispatcher`). Off: Celery's own dispatcher
behaviour (a flush per loop turn, buffer of 24, a task-sent message per task).

**`event-repr`: the shown result.** Celery's tracer renders each success's result with
`saferepr` for the task-succeeded event (`celery.app.trace` calls the module-level name
`saferepr(R, resultrepr_maxsize)`); `result_repr` gives the same text for a run's
`{trace_id, outcome}` at a twentieth of the cost, installed as `celery.app.trace.saferepr`.
Off: `celery.utils.saferepr.saferepr` there again.
"""

from __future__ import annotations

import string
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery.app import trace as celery_trace
from celery.events.dispatcher import EventDispatcher
from celery.utils.saferepr import saferepr
from kombu.asynchronous import get_event_loop

from workers.patches.switches import Undo, enabled, replace

EVENT_FLUSH_INTERVAL_S = 0.1
"""The longest a worker's task event waits in its buffer (Flower sees it that much later)."""

EVENT_BUFFER_LIMIT = 100
"""A buffer this full is published at once, by the thread that filled it (Celery's default
is 24: a busy worker reached it every 30 ms, so its pool threads did most of the flushing)."""

SENT_EVENTS_PER_MESSAGE = 32
"""A chord header's task-sent events go out in messages of this many (see `hold_sent_events`):
half a `workers.app.PIPELINE_FLUSH_COMMANDS`, so each event leaves with its task's message."""

HELD_ATTRIBUTE = "fleet_held_sent_events"
"""The list a producer holds its task-sent events in while `hold_sent_events` is on."""


class BatchingDispatcher(EventDispatcher):  # type: ignore[misc]
    """Celery's event dispatcher, a worker's task events batched (`event-batching`)."""

    def __init__(
        self, *args: Any, on_send_buffered: Callable[[], None] | None = None, **kwargs: Any
    ) -> None:
        """As `EventDispatcher`; `on_send_buffered` (the worker's) is asked once per batch."""
        self.batching = enabled("event-batching")
        self._ask_loop = on_send_buffered
        self._asked = False
        self._flushed_at_s = 0.0
        if not self.batching:
            super().__init__(*args, on_send_buffered=on_send_buffered, **kwargs)
            return
        ask = self._ask_for_flush if on_send_buffered is not None else None
        kwargs.setdefault("buffer_limit", EVENT_BUFFER_LIMIT)
        super().__init__(*args, on_send_buffered=ask, **kwargs)

    def publish(self, type: str, fields: dict[str, Any], producer: Any, **kwargs: Any) -> Any:
        """See `EventDispatcher.publish` (every sender's `task-sent` goes this way).

        A producer that holds task-sent events (`hold_sent_events`) gets them as one
        `task.multi` message per SENT_EVENTS_PER_MESSAGE, as a worker sends its own.
        """
        held: list[Any] | None = getattr(producer, HELD_ATTRIBUTE, None)
        if type != "task-sent" or held is None:
            return super().publish(type, fields, producer, **kwargs)
        held.append(self._prepare_event(type, fields, blind=kwargs.get("blind", False)))
        if len(held) >= SENT_EVENTS_PER_MESSAGE:
            self.publish_held(producer)
        return None

    def publish_held(self, producer: Any) -> None:
        """Send the task-sent events `producer` holds, in one message."""
        held: list[Any] = getattr(producer, HELD_ATTRIBUTE)
        if held:
            with self.mutex:
                self._publish(list(held), producer, "task.multi")
            held.clear()

    def flush(self, errors: bool = True, groups: bool = True) -> None:
        """Publish the buffered events, or on the event loop, once the interval has passed."""
        if not self.batching:
            super().flush(errors=errors, groups=groups)
            return
        loop = get_event_loop()
        wait_s = self._flushed_at_s + EVENT_FLUSH_INTERVAL_S - time.monotonic()
        if groups and self.buffer_group and wait_s > 0 and loop and self._loop_may_wait():
            loop.call_later(wait_s, self.flush)
            groups = False
        elif groups:
            # Cleared before the buffer is copied: an event buffered from here on asks again.
            self._asked = False
            self._flushed_at_s = time.monotonic()
        super().flush(errors=errors, groups=groups)

    def close(self) -> None:
        """Publish what is buffered, then close (see `EventDispatcher.close`)."""
        if not self.batching:
            super().close()
            return
        self._flushed_at_s = 0.0
        super().flush()
        super().close()

    def _ask_for_flush(self) -> None:
        # Any thread, after buffering an event: one request to the loop per batch.
        if not self._asked and self._ask_loop is not None:
            self._asked = True
            self._ask_loop()

    def _loop_may_wait(self) -> bool:
        # The loop's timer is not thread-safe: only the loop's own thread (the worker's main
        # thread) schedules; a pool thread flushes because the buffer is full.
        waiting = sum(len(events) for events in self._group_buffer.values())
        on_loop = threading.current_thread() is threading.main_thread()
        return on_loop and waiting < self.buffer_limit


_PLAIN = frozenset(string.ascii_letters + string.digits + " !#$%&()*+,-./:;<=>?@[]^_`{|}~")
"""Characters `repr` and Celery's `saferepr` print alike inside a quoted string."""


def result_repr(result: Any, maxlen: int) -> str:
    """Celery's `saferepr(result, maxlen)`, the shown result of every task-succeeded event.

    A run task returns `{trace_id, outcome}`; for a flat dict of plain strings `repr` gives
    the same text at a twentieth of the cost (12 -> 0.5 us). Anything else is `saferepr`'s.
    """
    if type(result) is dict and all(
        type(k) is str and type(v) is str and _PLAIN.issuperset(k) and _PLAIN.issuperset(v)
        for k, v in result.items()
    ):
        text = repr(result)
        if len(text) <= maxlen:
            return text
    return str(saferepr(result, maxlen))


def install_result_repr() -> list[Undo]:
    """`event-repr`: Celery's tracer computes each success's shown result with `result_repr`."""
    return [replace(celery_trace, "saferepr", result_repr)]  # its only use there


@contextmanager
def hold_sent_events(app: Any, producer: Any) -> Iterator[None]:
    """Inside the block, `producer`'s task-sent events go out in batches; the rest at the end.

    If the block raises, the events not sent yet are dropped with it (the task messages
    they describe may not have left either); Flower learns of those tasks when a worker
    receives them.
    """
    if not enabled("event-batching"):
        yield
        return
    setattr(producer, HELD_ATTRIBUTE, [])
    try:
        yield
        publish_held = getattr(app.amqp._event_dispatcher, "publish_held", None)
        if publish_held is not None:  # else nothing was held: another dispatcher class
            publish_held(producer)
    finally:
        delattr(producer, HELD_ATTRIBUTE)
