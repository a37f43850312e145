"""Every Redis key built from a trace id refuses a string that is not one (ROOT:messages)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator

import pytest
from redis.crc import key_slot

from fleet.errors import InvalidTraceId, MemoryRefused
from fleet.storage import keys

TRACE_KEYS: list[Callable[..., str]] = [
    fn
    for _, fn in inspect.getmembers(keys, inspect.isfunction)
    if fn.__module__.startswith(keys.__name__)
    and next(iter(inspect.signature(fn).parameters), None) in ("trace_id", "root_trace_id")
]


def test_there_are_trace_keys() -> None:
    names = {fn.__name__ for fn in TRACE_KEYS}
    assert {"trace", "collaborators", "events", "lease", "budget", "tree"} <= names


@pytest.mark.parametrize("fn", TRACE_KEYS, ids=lambda fn: fn.__name__)
@pytest.mark.parametrize("bad", ["R:messages", "fleet:*", "a b", "x\x1b]0;t\x07", "", "é"])
def test_a_trace_key_refuses_what_is_not_a_trace_id(fn: Callable[..., str], bad: str) -> None:
    extra = ["call_1"] * (len(inspect.signature(fn).parameters) - 1)
    with pytest.raises(InvalidTraceId):
        fn(bad, *extra)
    assert fn("20261126T021500-3f9a2c@explore-001-20261126021501-001", *extra)


CHILD = "20261126T021500-3f9a2c@explore-001-20261126021501-001@delegate-20261126021502-001"


@pytest.fixture
def cluster_layout() -> Iterator[None]:
    keys.use_cluster_layout(True)
    yield
    keys.use_cluster_layout(False)


@pytest.mark.usefixtures("cluster_layout")
def test_in_the_cluster_layout_a_tree_is_one_slot() -> None:
    root = CHILD.split("@")[0]
    slots = set()
    for fn in TRACE_KEYS:
        if fn is keys.limit_ticket or fn.__name__.startswith("legacy_"):
            continue  # the limiter's own slot; layout-1 keys, read only by `fleet migrate`
        extra = ["call_1"] * (len(inspect.signature(fn).parameters) - 1)
        slots |= {key_slot(fn(CHILD, *extra).encode()), key_slot(fn(root, *extra).encode())}
    assert slots == {key_slot(keys.trace(root).encode())}
    assert keys.trace(CHILD) == f"fleet:trace:{{{root}}}@explore-001-20261126021501-001" + (
        "@delegate-20261126021502-001"
    )


@pytest.mark.usefixtures("cluster_layout")
def test_in_the_cluster_layout_the_limiter_is_one_slot() -> None:
    named = [keys.limit_stats(), keys.limit_ticket(CHILD)]
    for scope in ("openai", "openai/gpt-4o", "x}{y"):
        named += [keys.limit_state(scope), keys.limit_slots(scope), keys.limit_pause(scope)]
        named += [keys.limit_line(scope), keys.limit_seen(scope), keys.limit_sends(scope)]
    assert len({key_slot(name.encode()) for name in named}) == 1


def test_the_plain_layout_names_keys_as_before() -> None:
    assert keys.trace("r@x") == "fleet:trace:r@x"
    assert keys.limit_state("openai") == "fleet:limit:openai"
    assert keys.limit_stats() == "fleet:limit-stats"
    assert keys.limit_ticket("r@x") == "fleet:limit-ticket:r@x"
    assert keys.batch_calls() == "fleet:batch:calls"
    assert keys.batch_answer("c-1_a") == "fleet:batch:answer:c-1_a"
    assert keys.image("r", "abc") == "fleet:image:r:abc"


BATCH_KEYS = [
    keys.batch_calls,
    keys.batch_state,
    keys.batch_queued,
    keys.batch_deadlines,
    keys.batch_submitting,
    keys.batch_in_flight,
    keys.batch_poll,
    keys.batch_polling,
]


@pytest.mark.usefixtures("cluster_layout")
def test_in_the_cluster_layout_the_provider_batches_are_one_slot() -> None:
    named = [fn() for fn in BATCH_KEYS] + [keys.batch_answer("c-1"), keys.batch_answer("z_9")]
    assert len({key_slot(name.encode()) for name in named}) == 1
    assert keys.batch_calls() == "fleet:{batch}:calls"


@pytest.mark.usefixtures("cluster_layout")
def test_in_the_cluster_layout_a_tree_s_images_are_in_its_slot() -> None:
    root = CHILD.split("@")[0]
    assert keys.image(root, "d1") == f"fleet:image:{{{root}}}:d1"
    slot = key_slot(keys.trace(root).encode())
    assert key_slot(keys.image(root, "d1").encode()) == slot
    assert key_slot(keys.image_bytes(root).encode()) == slot


@pytest.mark.parametrize("bad", ["x}{y", "{batch}", "a:b", "", "../x"])
def test_a_batch_answer_key_refuses_an_id_that_could_move_its_slot(bad: str) -> None:
    with pytest.raises(ValueError, match="not a batch custom id"):
        keys.batch_answer(bad)


@pytest.mark.usefixtures("cluster_layout")
def test_in_the_cluster_layout_a_memory_namespace_is_one_slot() -> None:
    spaces = [
        keys.memory_entries("user:alice"),
        keys.memory_history("user:alice", "profile"),
        keys.memory_history("user:alice", "agent_errors"),
        keys.memory_proposals("user:alice"),
    ]
    assert len({key_slot(k.encode()) for k in spaces}) == 1
    assert keys.memory_entries("user:alice") == "fleet:{memory:user:alice}:entries"


@pytest.mark.parametrize("bad", ["user:*", "fleet:a b", "x:y\x1b]0;t\x07", "", "USER:a"])
def test_a_memory_key_refuses_what_is_not_a_namespace(bad: str) -> None:
    with pytest.raises(MemoryRefused):
        keys.memory_entries(bad)
    with pytest.raises(MemoryRefused):
        keys.memory_history("user:alice", bad or "a:b")
