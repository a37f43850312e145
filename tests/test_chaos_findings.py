"""The chaos harness names every finding of a round (`bench.chaos_parts.table.Row`).

Seed 40 of `make chaos` counted 3 *doubled* that no round named: the Batch API, remote,
`fleet batch` and experience checks added to the row without printing.
"""

from __future__ import annotations

from bench.chaos_parts.table import Row


def test_a_round_prints_each_new_finding_by_its_column() -> None:
    row = Row(doubled=["round 1: Batch API custom id c-1 sent 2 times"])
    counts = row.counts()
    row.doubled += [
        "round 2: remote task 'review T2x0' sent 2 times",
        "round 2 explore-small: T2@explore-001: tool result of call c1 twice",
    ]
    row.costs.append("round 2 budget: R: budget used 9 tokens, turns spent 39 (root completed)")
    row.tracebacks += [f"worker.log: line {i}" for i in range(5)]

    lines = row.findings_since(counts, shown=3)

    assert lines == [
        "doubled: round 2: remote task 'review T2x0' sent 2 times",
        "doubled: round 2 explore-small: T2@explore-001: tool result of call c1 twice",
        "costs off: round 2 budget: R: budget used 9 tokens, turns spent 39 (root completed)",
        "traceback: worker.log: line 0",
        "traceback: worker.log: line 1",
        "traceback: worker.log: line 2",
        "traceback: ... and 2 more",
    ]
    assert row.breaks == 9
