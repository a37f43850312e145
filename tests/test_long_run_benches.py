"""The arithmetic of the long-run benches (`bench/soak.py`, `bench/autoscale.py`,
`bench/memtrace.py`): what their reports say is computed right, without a fleet.

The runs themselves take minutes to hours (docs/performance.md "Soak", docs/operations.md
"Stopping and upgrading workers"); these keep the numbers they print honest.
"""

from __future__ import annotations

import argparse
import tracemalloc
from pathlib import Path

import fakeredis
import pytest

from bench import autoscale, memtrace, soak


def test_a_slope_is_per_ten_minutes_and_flat_is_zero() -> None:
    rising = [{"minute": m, "rss": 80 + 0.1 * m} for m in range(1, 31)]
    assert soak.slope_per_10_min(rising, "rss") == pytest.approx(1.0)
    flat = [{"minute": m, "rss": 80.0} for m in range(1, 31)]
    assert soak.slope_per_10_min(flat, "rss") == 0.0
    assert soak.slope_per_10_min(flat[:1], "rss") == 0.0, "one row has no slope"


def test_percentiles_of_none_one_and_many() -> None:
    assert soak.percentiles("t", []) == {"t_p50": 0.0, "t_p99": 0.0}
    assert soak.percentiles("t", [7.0]) == {"t_p50": 7.0, "t_p99": 7.0}
    many = soak.percentiles("t", [float(v) for v in range(1, 101)])
    assert many["t_p50"] == 50 and many["t_p99"] == 100


def test_keys_without_a_ttl_are_counted_by_shape_with_ids_folded() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    client.set("fleet:trace:20261129T013932-09f3df@explore-003-20261129013935-001", "x")
    client.set("fleet:trace:20261129T013933-0a1b2c@explore-001-20261129013936-001", "x")
    client.set("fleet:roots", "x")
    client.set("celery-task-meta-5d1c", "x", ex=86_400)
    assert soak.lasting(client) == {"fleet:trace:N@explore-N-N-N": 2, "fleet:roots": 1}
    assert soak.lasting(client, over_s=600) == {
        "fleet:trace:N@explore-N-N-N": 2,
        "fleet:roots": 1,
        "celery-task-meta-NdNc": 1,
    }


@pytest.mark.parametrize(
    ("metric", "replicas"), [(0, 1), (1, 1), (8, 1), (9, 2), (48, 6), (200, 6)]
)
def test_the_scaler_sizes_replicas_as_the_hpa_does(metric: int, replicas: int) -> None:
    options = argparse.Namespace(threshold=8, min_replicas=1, max_replicas=6)
    scaler = autoscale.Scaler({}, options, observer=None)  # type: ignore[arg-type]
    assert scaler.desired(metric) == replicas


def test_the_calls_a_burst_needs_are_what_the_issue_run_counted() -> None:
    # 50 explores of 4 branches, each branch 2 looks and an answer, twice: 1,400 calls.
    options = autoscale.parse(["--trees", "50", "--cycles", "2"])
    assert autoscale.calls_needed(options) == 1400


def test_memtrace_names_the_site_that_grew(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tracemalloc.start(memtrace.FRAMES)
    try:
        tracemalloc.take_snapshot().dump(str(tmp_path / "old.snap"))
        kept = [bytearray(4096) for _ in range(64)]  # ~256 KiB, here
        tracemalloc.take_snapshot().dump(str(tmp_path / "new.snap"))
    finally:
        tracemalloc.stop()
    assert len(kept) == 64
    assert memtrace.main(["--compare", str(tmp_path / "old.snap"), str(tmp_path / "new.snap")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("traced: +")
    assert int(lines[1].split()[-2]) >= 64, lines[1]  # the 64 arrays (and their buffers)
    assert "test_long_run_benches.py" in "\n".join(lines[2:4]), lines[:4]
