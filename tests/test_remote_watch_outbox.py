"""The remote watcher owes a child's run to the outbox when the broker refuses it.

make chaos seed 43 round 4 (a RabbitMQ restart): the watcher saw the remote task end,
forgot the watch entry, and the child's run met the broker away: nothing owed the child
its run but the owner check, after the tree's quiet period.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from kombu.exceptions import OperationalError

from fleet.models import Trace
from fleet.storage import outbox
from fleet.testing import MemoryStore
from workers import remote_poll


def test_a_remote_child_the_broker_refuses_once_its_task_ended_is_owed_to_the_outbox(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    store.create_trace(Trace(trace_id="r@remote-1", root_trace_id="r", task="t"))
    runtime = SimpleNamespace(store=store)

    async def ended(*_: object) -> bool:
        return True

    def refused(*_: object, **__: object) -> None:
        raise OperationalError("[Errno 111] Connection refused")

    monkeypatch.setattr(remote_poll, "get_runtime", lambda: runtime)
    monkeypatch.setattr(remote_poll, "follow_one", ended)
    monkeypatch.setattr(remote_poll, "tree_schedule", lambda *_: SimpleNamespace(priority=0))
    monkeypatch.setattr(remote_poll, "send_answered", refused)
    caplog.set_level(logging.WARNING, "workers.remote_poll")

    asyncio.run(remote_poll._follow_and_send("r@remote-1"))

    assert store.outbox_claim(10**15, 1_000) == [outbox.run_entry("r@remote-1")]
    assert [r.exc_info for r in caplog.records] == [None], "one line"
