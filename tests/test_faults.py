"""The fault-injection suite in small (`bench/faults.py`): one run per fault, nothing lost.

`make faults` runs every scenario 20 times and docs/reliability.md records the table; here
each runs once, with a short freeze and outage, so CI sees a regression in minutes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench import faults

pytestmark = pytest.mark.integration

QUICK = replace(faults.QUICK, runs=1)


# worker SIGKILL (independent and under `fleet up`) and the orphaned spawn have their own
# tests: test_fleet_recovery.py, test_supervisor.py, test_outbox_watchdog.py.
@pytest.mark.parametrize(
    "scenario", ["freeze", "redis-restart", "redis-kill", "outage", "provider"]
)
def test_nothing_is_lost_or_doubled(scenario: str) -> None:
    rows = faults.run([scenario], QUICK, say=print)
    for row in rows:
        assert row.runs >= 1
        assert (row.completed, row.lost, row.duplicated) == (row.runs, 0, 0), row.notes
