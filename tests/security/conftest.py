"""A hardened worker for the attack tests: narrow workspace roots, secrets in its env."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from tests.procs import start_worker, wait_for_workers
from tests.security.attacker import SECRET_ENV

SECURITY_DB = 13
"""A database of its own, so other modules' workers never take these tasks."""


@dataclass(frozen=True)
class HardenedFleet:
    """Where the hardened worker listens and what it may touch."""

    url: str
    root: Path
    """The worker's only workspace root."""


@pytest.fixture(scope="module")
def hardened(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HardenedFleet]:
    """One worker process holding every secret of `SECRET_ENV`, roots = one temp folder."""
    url = urlsplit(redis_url)._replace(path=f"/{SECURITY_DB}").geturl()
    root = tmp_path_factory.mktemp("root").resolve()
    with redis.Redis.from_url(url) as admin:
        admin.flushdb()
    env = {
        **SECRET_ENV,
        "FLEET_WORKSPACE": str(root),
        "FLEET_WORKSPACE_ROOTS": str(root),
        "FLEET_ALLOW_SCRIPTED": "1",
        "FLEET_ALLOW_SHELL": "1",
    }
    with start_worker(url, concurrency=4, env_extra=env) as worker:
        wait_for_workers(url, [worker.name], timeout_s=30)
        yield HardenedFleet(url, root)
