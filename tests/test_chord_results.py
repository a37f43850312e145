"""What Celery's result backend keeps of an explore once it is over, on a real worker and Redis.

The fleet's own state is in its Redis; Celery's results of a fleet chord are only the
join's keys (`workers.patches.chord_join`) and, before they were turned off, each body's
stored result: those outlived the join by `result_expires` (24 h), about two keys per
explore, the soak's whole Redis growth.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet.client import Fleet
from tests.fleetkit import celery_fleet, explore_script
from workers.app import app
from workers.patches import chord_join

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

EXPLORES = 20


@pytest.fixture
def fleet(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Fleet]:
    with celery_fleet(redis_url, tmp_path, monkeypatch, 16) as fleet:
        yield fleet


def celery_keys(client: redis.Redis) -> dict[str, tuple[int, int, int]]:
    """Celery's keys by kind (`task-meta`, a group key's suffix): how many, the longest TTL
    and their bytes (`MEMORY USAGE`)."""
    kinds: dict[str, tuple[int, int, int]] = {}
    for key in client.scan_iter("celery-*", count=1000):
        kind = "task-meta" if key.startswith("celery-task-meta-") else key.rsplit(".", 1)[-1]
        count, longest, size = kinds.get(kind, (0, 0, 0))
        used = int(client.memory_usage(key) or 0)
        kinds[kind] = (count + 1, max(longest, client.ttl(key)), size + used)
    return kinds


def test_an_explore_over_leaves_no_celery_result_behind(
    fleet: Fleet, redis_client: redis.Redis, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 3)
    handles = [fleet.submit(f"survey {i}", model=model) for i in range(EXPLORES)]
    for handle in handles:
        assert handle.wait(timeout_s=120).status == "completed"
    kinds = celery_keys(redis_client)
    print(f"celery keys after {EXPLORES} explores of 3 (count, longest TTL s, bytes): {kinds}")
    # Before: 20 `task-meta` (each body's result) and 20 `fc`, both for 24 h.
    assert set(kinds) <= {"fc"}, kinds
    count, longest, _ = kinds.get("fc", (0, 0, 0))
    assert count <= EXPLORES and longest <= chord_join.done_ttl_s(app.backend) < 24 * 3600
