"""A chord sent without Celery's canvas: the same messages, no signature clones.

The `chord-send` patch (`workers.patches.switches`), written and tested against Celery
5.7.0 and kombu 5.7.0. `send_chord` reproduces what `chord(header, body).apply_async()`
sends (`celery.canvas._chord.run` and `group._apply_tasks`), relying on: the backend's
`apply_chord((group_id, results), body)` before the first header and
`set_chord_size(group_id, size)` before the last; `Celery.send_task` taking `group_id`,
`group_index`, `chord` (the frozen body) and `add_to_parent`; and the header's options as
`Task.apply_async` passes them. tests/test_dispatch_publish.py sends both ways and
compares every message, key and event: a Celery whose canvas sends anything else fails
there. Off (`workers.dispatch`): the canvas sends the chord, at about a quarter more
dispatch CPU; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery, Task
from celery.canvas import Signature
from kombu.messaging import Producer
from kombu.utils.uuid import uuid

from workers.patches.header_messages import HeaderTemplate, first_publish, publish_signals_connected
from workers.patches.switches import enabled


def send_chord(app: Celery, header: Sequence[Signature], body: Signature) -> str:
    """Send `chord(header, body)` for a flat header of immutable task signatures.

    What `chord(header, body).apply_async()` sends, built once per header task: Celery's
    canvas clones every header signature three times on the way (the group's freeze, its
    `_prepared` and the merge of each task's `apply_async`), each clone deep-copying the
    options with the chord body and its errback inside; that was a quarter of an
    explore's dispatch CPU. Here, as there: the body is frozen with the group id and rides
    in every header message as `chord`; each header message carries the group id, its
    `group_index` and the task's own options (queue, priority, stamps, argsrepr, shadow);
    the backend's `apply_chord` runs before the first message is sent and
    `set_chord_size` before the last; `app.send_task` publishes the first message with its
    task-sent event and Celery's publish signals, through the thread's producer (the
    `one_pipeline` one in a dispatch), and every later header that differs from the first
    only in its ids, args, `argsrepr`, `shadow` and stamps is published from the first's
    message (`workers.patches.header_messages`: in a Redis publish batch with no receiver of the
    publish signals; any other header goes through `send_task`). Unlike the canvas,
    nothing is added to the sending task's result trail (`request.children`): no reader.

    An empty header sends the body at once with no results, as the canvas does. `body` is
    frozen in place. Returns the group id.
    """
    group_id = uuid()
    body.freeze(uuid(), group_id=group_id)
    task_ids = [uuid() for _ in header]
    if not header:  # as the canvas does: nothing would ever count down to the body
        body.apply_async(([],))
        return group_id
    app.backend.apply_chord((group_id, [app.AsyncResult(t) for t in task_ids]), body)
    last = len(header) - 1
    template: HeaderTemplate | None = None
    with app.producer_or_acquire() as producer:
        for index, (signature, task_id) in enumerate(zip(header, task_ids, strict=True)):
            options = header_options(signature, app.tasks.get(signature.task))
            if index == last:  # the group's send sets the size just before its last task
                app.backend.set_chord_size(group_id, len(header))
            if template is not None and template.fits(signature, options):
                template.publish(signature, options, task_id, index)
            elif index == 0 and templates_apply(producer):
                with first_publish(producer) as published:
                    send_header(app, producer, signature, options, task_id, index, body)
                if published:
                    template = HeaderTemplate.of(app, producer, signature, options, published[0])
            else:
                send_header(app, producer, signature, options, task_id, index, body)
    return group_id


def templates_apply(producer: Producer) -> bool:
    """Headers from a template: in a Redis publish batch, with no publish signal receivers.

    Never with `header-template` off: then every header goes through `send_task`.
    """
    if not enabled("header-template"):
        return False
    batch = getattr(producer._batch_local, "current", None)
    transport = producer.connection.transport
    return (
        batch is not None and transport.driver_type == "redis" and not publish_signals_connected()
    )


def send_header(
    app: Celery,
    producer: Producer,
    signature: Signature,
    options: dict[str, Any],
    task_id: str,
    index: int,
    body: Signature,
) -> None:
    """One header message (and its task-sent event) through Celery's `send_task`."""
    app.send_task(
        signature.task,
        signature.args,
        signature.kwargs,
        task_id=task_id,
        producer=producer,
        group_id=body.options["group_id"],
        group_index=index,
        chord=body,
        add_to_parent=False,
        **options,
    )


def header_options(signature: Signature, task: Task | None) -> dict[str, Any]:
    """The signature's options as its task's `apply_async` passes them to `send_task`.

    `send_task` adds the task's own execution options (time limits, serializer) as it does
    for every task it finds in the registry; `ignore_result` is the one default it leaves
    to `Task.apply_async`.
    """
    options = {k: v for k, v in signature.options.items() if v is not None}
    if task is not None:
        options.setdefault("ignore_result", task.ignore_result)
    return options
