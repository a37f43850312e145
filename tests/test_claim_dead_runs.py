"""The sweeper's claim of lapsed leases survives a trace whose record is gone.

make chaos (seed 41, a Cluster master killed): a lease index entry outlived its trace's
record, `claim_dead_runs` raised TraceNotFound ("sweep_once failed" with a traceback), and
the traces it had claimed before it, already out of the running index, were never sent
again by that sweep.
"""

from __future__ import annotations

from typing import Any

from fleet.control import claim_dead_runs
from fleet.errors import TraceNotFound


class _Store:
    def __init__(self, traces: dict[str, str]) -> None:
        self.traces = traces  # trace id -> status; a missing id is a trace gone
        self.running = ["a", "gone", "b", "done"]

    def expired_leases(self, at_ms: int) -> list[str]:
        return list(self.running)

    def forget_running(self, trace_id: str) -> bool:
        self.running.remove(trace_id)
        return True

    def get_trace(self, trace_id: str) -> Any:
        if trace_id not in self.traces:
            raise TraceNotFound(trace_id)
        status = self.traces[trace_id]
        return type("T", (), {"is_terminal": status in ("completed", "failed", "stopped")})()


def test_a_trace_gone_is_skipped_and_the_others_are_claimed() -> None:
    store = _Store({"a": "running", "b": "running", "done": "completed"})

    claimed = claim_dead_runs(store, at_ms=0)  # type: ignore[arg-type]

    assert claimed == ["a", "b"]
    assert store.running == []
