"""A host's own step in the store's atomic write (`WriteExtension`), as the store sees it.

The store runs a registered Lua function inside the write's script and knows nothing of
what it does (the Celery binding's chord join is one: tests/test_chord_join.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from fleet.errors import LeaseLost
from fleet.models import Trace
from fleet.storage.backends.redis import scripts as redis_scripts
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.writes import TraceWrite, WriteExtension
from fleet.testing import MemoryStore

COUNTER = """
local function test_counter(key, by)
  return redis.call('INCRBY', key, by)
end
"""

redis_scripts.register_write_extension("test-counter", COUNTER, "test_counter")


def counting(key: str, by: int = 2) -> WriteExtension:
    return WriteExtension("test-counter", [key], lambda: [str(by)])


def test_registering_a_name_again_differently_is_refused() -> None:
    redis_scripts.register_write_extension("test-counter", COUNTER, "test_counter")  # no-op
    with pytest.raises(ValueError, match="already registered"):
        redis_scripts.register_write_extension("test-counter", COUNTER + "\n", "test_counter")
    with pytest.raises(ValueError, match="not a Lua name"):
        redis_scripts.register_write_extension("bad", COUNTER, "test-counter()")
    with pytest.raises(ValueError, match="no write extension 'nobody'"):
        redis_scripts.apply_source("nobody")


def test_one_write_runs_one_extension_and_a_memory_store_refuses_it() -> None:
    write = TraceWrite("t", "t").extend(counting("k"))
    with pytest.raises(ValueError, match="one extension"):
        write.extend(counting("k"))
    memory = MemoryStore()
    memory.create_trace(Trace(trace_id="t", root_trace_id="t", task="main"))
    with pytest.raises(TypeError, match="Redis store"):
        memory.apply(write.update(status="completed"))


@pytest.fixture
def store(redis_client: redis.Redis, redis_url: str) -> Iterator[RedisStore]:
    with RedisStore.from_url(redis_url) as trace_store:
        trace_store.create_trace(Trace(trace_id="t", root_trace_id="t", task="main"))
        yield trace_store


@pytest.mark.integration
def test_the_store_runs_the_extension_in_the_write_and_reports_its_reply(
    store: RedisStore, redis_client: redis.Redis
) -> None:
    step = counting("test:counter", by=3)
    store.apply(TraceWrite("t", "t").update(status="completed").extend(step))
    assert step.applied and step.reply == 3
    assert redis_client.get("test:counter") == "3"
    assert store.get_trace("t").status == "completed"
    plain = TraceWrite("t", "t").update(status="failed")
    store.apply(plain)  # a write without an extension: the plain script
    assert redis_client.get("test:counter") == "3"


@pytest.mark.integration
def test_a_refused_write_runs_no_extension(store: RedisStore, redis_client: redis.Redis) -> None:
    step = counting("test:counter")
    write = TraceWrite("t", "t").update(status="completed").extend(step)
    with pytest.raises(LeaseLost):  # the fence fails the whole script: nothing of it ran
        store.fenced("t", "not-the-owner").apply(write)
    assert not step.applied and step.reply is None
    assert redis_client.get("test:counter") is None
    assert store.get_trace("t").status != "completed"
