"""Every Redis key built from a trace id refuses a string that is not one (ROOT:messages)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from fleet.errors import InvalidTraceId
from fleet.storage import keys

TRACE_KEYS: list[Callable[..., str]] = [
    fn
    for _, fn in inspect.getmembers(keys, inspect.isfunction)
    if fn.__module__ == keys.__name__
    and next(iter(inspect.signature(fn).parameters)) in ("trace_id", "root_trace_id")
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
