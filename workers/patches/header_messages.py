"""A chord's header messages from one template: Celery's message, encoded once per chord.

Every header message of a fleet chord is the same but for a few values: the task id (also
the correlation id, and the root id of a task sent outside a task), the `group_index`, the
`argsrepr` and `shadow`, the stamps' values and the args. `app.send_task` builds each one
from scratch (routing, the task's options, `as_task_v2`, kombu's `Producer.publish` with
its encoding of the whole body, the frozen chord body included, and a retry wrapper), which
was ~60 % of a dispatch's CPU. Here the first header goes through `app.send_task`, and
what reaches kombu's `Producer._publish` for it (the body as encoded, headers, properties,
routing) is kept as the template; each later header whose signature differs from the
first only in those values is published from a copy of it, through the same
`Producer._publish` (with the same `Connection.ensure` wrapper when the publish retries),
followed by its task-sent event as `send_task` sends it. Anything else (another task,
other options, a transport without publish batches, a receiver of Celery's publish
signals) goes through `app.send_task` as before. `tests/test_dispatch_publish.py` compares
the result with `chord(header, body).apply_async()`.

The `header-template` patch (`workers.patches.switches`), written and tested against
kombu 5.7.0 and Celery 5.7.0. Internals used: `Producer._publish`'s 15 positional
arguments in the order `_PUBLISH_ARGS` names, called once per message by
`Producer.publish`; `Producer._batch_local.current` (set inside `Producer.batch`:
`workers.patches.chords.templates_apply`); `Connection.ensure(obj, fun, **policy)`;
`app.amqp._event_dispatcher` and its `publish("task-sent", fields, producer, retry=,
retry_policy=)`; the shape of `as_task_v2`'s headers and task-sent event.
tests/test_celery_patches.py checks the signatures, tests/test_dispatch_publish.py the
messages. Off: every header goes through `app.send_task` (about 60 % more dispatch CPU).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery import Celery, signals
from celery.canvas import Signature
from kombu.messaging import Producer
from kombu.utils.json import dumps

VARYING = frozenset({"argsrepr", "shadow"})
"""Options a header may change (with the values of its `stamped_headers`) and still fit."""

_PUBLISH_ARGS = 15
"""`Producer._publish(body, priority, content_type, content_encoding, headers, properties,
routing_key, mandatory, immediate, exchange, declare, timeout, confirm_timeout, retry,
retry_policy)`."""

_BODY, _HEADERS, _PROPERTIES, _ROUTING_KEY, _EXCHANGE, _RETRY, _RETRY_POLICY = 0, 4, 5, 6, 9, 13, 14


CONSTANT_HEADER_RECEIVERS: set[int] = set()
"""Ids of publish-signal receivers that give every message the same headers: a template,
copied from the first message they stamped, carries them (`constant_headers`)."""


def constant_headers(receiver: Callable[..., None]) -> Callable[..., None]:
    """Mark a `before_task_publish` receiver whose headers are the same for every message."""
    CONSTANT_HEADER_RECEIVERS.add(id(receiver))
    return receiver


def publish_signals_connected() -> bool:
    """Whether anything listens to Celery's per-message publish signals (then no template).

    The fleet's own schema stamp (`workers.app`) adds one constant header, which the
    template copies; an OpenTelemetry Celery instrumentation would count (it adds its trace
    context, different for each message, in `before_task_publish`).
    """
    publish = (signals.before_task_publish, signals.after_task_publish, signals.task_sent)
    return any(
        key[0] not in CONSTANT_HEADER_RECEIVERS for signal in publish for key, _ in signal.receivers
    )


@contextmanager
def first_publish(producer: Producer) -> Iterator[list[tuple[Any, ...]]]:
    """Inside the block, the arguments of `producer`'s first `_publish` are kept (a copy)."""
    calls: list[tuple[Any, ...]] = []
    original = producer._publish

    def keep(*args: Any) -> Any:
        if not calls:
            # The transport fills the properties in place: keep them as they were given.
            mutable = copy.deepcopy(args[_HEADERS : _PROPERTIES + 1])
            calls.append((*args[:_HEADERS], *mutable, *args[_PROPERTIES + 1 :]))
        return original(*args)

    producer._publish = keep  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del producer._publish


@dataclass(frozen=True)
class HeaderTemplate:
    """The first header's message; `publish` sends another header from a copy of it."""

    task: str
    kwargs: dict[str, Any]
    options: dict[str, Any]
    """The first header's options that every header must share (all but the varying)."""
    keys: frozenset[str]
    """The names of the first header's options: every header has the same."""
    stamped: tuple[str, ...]
    args: tuple[Any, ...]
    """What `Producer._publish` was called with for the first header."""
    kwargs_json: str
    embed_json: str
    """The body after the args and kwargs: `, {callbacks, errbacks, chain, chord}]`."""
    root_is_id: bool
    """Sent outside a task: each message's root id is its own id."""
    publish_fn: Callable[..., Any]
    send_event: Callable[[dict[str, Any]], Any] | None

    @classmethod
    def of(
        cls, app: Celery, producer: Producer, first: Signature, options: dict[str, Any], args: Any
    ) -> HeaderTemplate | None:
        """The template of `first`, sent with `options` and published with `args`.

        None if its message is not one a template reproduces: another serializer,
        compression, a routed exchange, or no `argsrepr` (Celery would make one per task).
        """
        if len(args) != _PUBLISH_ARGS or "argsrepr" not in options:
            return None
        prefix = f"[{dumps(list(first.args))}, {dumps(first.kwargs)}, "
        body, headers = args[_BODY], args[_HEADERS]
        if not isinstance(body, str) or not body.startswith(prefix) or args[_EXCHANGE]:
            return None  # another serializer, compression, or a routed exchange
        stamped = tuple(options.get("stamped_headers") or ())
        varying = VARYING.union(stamped)
        ensured = producer._publish
        if args[_RETRY]:  # as `Producer.publish` wraps it, once per chord instead of per header
            ensured = producer.connection.ensure(producer, ensured, **args[_RETRY_POLICY])
        return cls(
            task=first.task,
            kwargs=first.kwargs,
            options={k: v for k, v in options.items() if k not in varying},
            keys=frozenset(options),
            stamped=stamped,
            args=args,
            kwargs_json=dumps(first.kwargs),
            embed_json=body[len(prefix) :],
            root_is_id=headers["root_id"] == headers["id"],
            publish_fn=ensured,
            send_event=_event_sender(app, producer, args)
            if app.conf.task_send_sent_event
            else None,
        )

    def fits(self, signature: Signature, options: dict[str, Any]) -> bool:
        """Whether a header's message is this one's with the varying values changed."""
        return (
            signature.task == self.task
            and isinstance(signature.args, list | tuple)
            and signature.kwargs == self.kwargs
            and options.keys() == self.keys
            and all(options[k] == v for k, v in self.options.items())
        )

    def publish(
        self, signature: Signature, options: dict[str, Any], task_id: str, index: int
    ) -> None:
        """Send a header that `fits`, then its task-sent event."""
        headers = dict(self.args[_HEADERS])
        headers["id"] = task_id
        if self.root_is_id:
            headers["root_id"] = task_id
        headers["group_index"] = index
        headers["shadow"] = options.get("shadow")
        headers["argsrepr"] = argsrepr = options["argsrepr"]
        headers["stamps"] = {k: options[k] for k in self.stamped}
        properties = dict(self.args[_PROPERTIES])
        properties["correlation_id"] = task_id
        if "argsrepr" in properties:  # an option `send_task` leaves to the properties
            properties["argsrepr"] = argsrepr
        body = f"[{dumps(list(signature.args))}, {self.kwargs_json}, {self.embed_json}"
        self.publish_fn(body, *self.args[1:_HEADERS], headers, properties, *self.args[6:])
        if self.send_event is not None:
            self.send_event(headers)


def _event_sender(
    app: Celery, producer: Producer, args: tuple[Any, ...]
) -> Callable[[dict[str, Any]], Any]:
    """Sends a message's task-sent event with the fields `send_task` gives it."""
    dispatcher = app.amqp._event_dispatcher
    retry = args[_RETRY]
    retry_policy = args[_RETRY_POLICY]
    routing_key = args[_ROUTING_KEY]

    def send(headers: dict[str, Any]) -> Any:
        fields = {
            "uuid": headers["id"],
            "root_id": headers["root_id"],
            "parent_id": headers["parent_id"],
            "name": headers["task"],
            "args": headers["argsrepr"],
            "kwargs": headers["kwargsrepr"],
            "retries": headers["retries"],
            "eta": headers["eta"],
            "expires": headers["expires"],
            "queue": routing_key,  # the anonymous exchange routes by queue name
            "exchange": "",
            "routing_key": routing_key,
        }
        return dispatcher.publish(
            "task-sent", fields, producer, retry=retry, retry_policy=retry_policy
        )

    return send
