"""What `fleet trace show` prints of a trace's times and goals (pure functions)."""

from __future__ import annotations

import pytest

from fleet.models import Trace
from fleetops.cli.output import duration, goal_status, timing

STARTED_MS = 1_795_905_229_000  # 2026-11-28 22:33:49 UTC


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (-5, "0 ms"),
        (850, "850 ms"),
        (12_340, "12.3 s"),
        (245_000, "4 min 05 s"),
        (7_380_000, "2 h 03 min"),
    ],
)
def test_durations_read_in_the_unit_that_fits(ms: int, shown: str) -> None:
    assert duration(ms) == shown


def test_a_finished_trace_shows_when_it_started_and_how_long_it_took() -> None:
    trace = Trace(
        trace_id="t",
        root_trace_id="t",
        task="x",
        status="completed",
        created_at_ms=STARTED_MS,
        finished_at_ms=STARTED_MS + 12_340,
    )
    assert timing(trace) == "started 2026-11-28 22:33:49 UTC, took 12.3 s"


def test_a_running_trace_shows_how_long_it_has_run() -> None:
    trace = Trace(
        trace_id="t", root_trace_id="t", task="x", status="running", created_at_ms=STARTED_MS
    )
    assert timing(trace, now_ms=STARTED_MS + 850) == (
        "started 2026-11-28 22:33:49 UTC, running for 850 ms"
    )


@pytest.mark.parametrize(
    ("trace_status", "goal", "shown"),
    [
        ("running", "in_progress", "in_progress"),
        ("waiting", "pending", "pending"),
        ("completed", "in_progress", "done"),
        ("completed", "pending", "abandoned"),
        ("completed", "done", "done"),
        ("failed", "in_progress", "abandoned"),
        ("stopped", "pending", "abandoned"),
        ("stopped", "done", "done"),
    ],
)
def test_a_finished_trace_has_no_goal_in_progress(trace_status: str, goal: str, shown: str) -> None:
    trace = Trace.model_validate(
        {"trace_id": "t", "root_trace_id": "t", "task": "x", "status": trace_status}
    )
    assert goal_status(goal, trace) == shown
