"""Issue 40's changes on a local 3-master Redis Cluster: no CROSSSLOT, same answers.

`begin_run` and a turn's write read the trace's inbox in their own script (the tree's
slot), a last write refused for a stop writes nothing, and the experiences' version check
and cache work across the cluster's slots.
"""

from __future__ import annotations

import pytest

from fleet.conversation.messages import LIMITS
from fleet.errors import StopLanded
from fleet.experiences.backends.redis import RedisExperiences
from fleet.experiences.model import new_experience
from fleet.experiences.retrieval import select
from fleet.models import Message, Trace, now_ms
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.inbox import INBOX
from fleet.storage.inbox_types import Posted
from fleet.storage.writes import InboxSeen, TraceWrite
from tests.test_cluster_stores import masters, store

pytestmark = pytest.mark.integration
__all__ = ["masters", "store"]

ROOT = "20261128T230000-c4d5e6"


def posted(text: str) -> Posted:
    return Posted(sender="lead", content=text, sent_at_ms=now_ms())


def test_the_inbox_rides_on_begin_run_and_the_write_on_a_cluster(store: RedisStore) -> None:
    child = f"{ROOT}@explore-001-20261128230001-001"
    store.create_trace(Trace(trace_id=ROOT, root_trace_id=ROOT, task="root"))
    store.create_trace(
        Trace(trace_id=child, root_trace_id=ROOT, parent_trace_id=ROOT, task="b", mode="explore")
    )
    began = store.begin_run(child, "me", 5_000)
    assert began is not None and began.inbox == InboxSeen(None)
    entry = store.capability(INBOX).post(child, posted("hello"), LIMITS, sender_trace_id=None)
    note = Message(trace_id=child, role="user", content="x")
    written = store.apply(TraceWrite(child, ROOT).append(note).read_inbox())
    assert written.inbox == InboxSeen(entry)
    store.request_stop(child)
    with pytest.raises(StopLanded):
        store.apply(TraceWrite(child, ROOT).append(note).refused_if_stopped())
    assert len(store.messages(child)) == 1


def test_the_experiences_cache_on_a_cluster(store: RedisStore) -> None:
    client = store.client
    worker, operator = RedisExperiences(client), RedisExperiences(client)
    trace = Trace(trace_id="t", root_trace_id="t", task="retry the flaky network test")
    rule = new_experience("agent:default", "a flaky network test", "retry it once", approved=True)
    operator.put(rule)
    assert [e.id for e in select(worker, trace)] == [rule.id]
    operator.remove(rule.id)
    assert select(worker, trace) == []
