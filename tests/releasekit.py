"""Processes of two releases on one fleet, for the mixed-version tests.

A release (`tests.previous.Release`) runs from its own venv, started outside this checkout
(`python -m` puts the working directory first on `sys.path`); this checkout's processes run
from the test's interpreter. Both share the test's Redis database and broker.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.previous import PREVIOUS, REF_ENV, Pin, Release, previous_release
from tests.procs import WorkerProcess, start_worker
from tests.test_fleet_rabbitmq import RABBITMQ_URL, purge_fleet_queues, rabbitmq_answers
from tests.test_fleet_recovery import FAST_RECOVERY, RUN_TIMEOUT_S, database_url

RETENTION_S = 3600
_names = itertools.count(1)


def installed(release: Pin | None = None) -> Release:
    """The release, built on first use; a missing commit fails under CI, else skips."""
    found = previous_release(release)
    if found is None:
        wanted = release or os.environ.get(REF_ENV) or PREVIOUS
        named = f"{wanted.tag} ({wanted.commit[:12]})" if isinstance(wanted, Pin) else wanted
        missing = f"release {named} is not in this checkout (a shallow clone? {REF_ENV}?)"
        if os.environ.get("CI"):  # CI must fetch it (a full clone; actions: fetch-depth: 0)
            pytest.fail(missing)
        pytest.skip(missing)
    return found


def worker_env(workspace: Path) -> dict[str, str]:
    """What every worker of the test's fleet gets, of either release."""
    return {"FLEET_WORKSPACE": str(workspace), "FLEET_ALLOW_SCRIPTED": "1", **FAST_RECOVERY}


def release_worker(
    stack: contextlib.ExitStack,
    release: Release | None,
    url: str,
    broker: str,
    workspace: Path,
    concurrency: int = 4,
) -> WorkerProcess:
    """A worker of `release` (None: this checkout) on the fleet's queues, Redis and broker."""
    if release is None:
        return stack.enter_context(
            start_worker(
                url, broker_url=broker, concurrency=concurrency, env_extra=worker_env(workspace)
            )
        )
    return stack.enter_context(
        start_worker(
            url,
            broker_url=broker,
            concurrency=concurrency,
            env_extra={**worker_env(workspace), **release.env()},
            python=str(release.python),
            cwd=workspace,
            name=f"previous{next(_names)}.{os.getpid()}@{release.sha[:8]}",
        )
    )


def release_env(release: Release, url: str, broker: str, workspace: Path) -> dict[str, str]:
    """The environment of a client or command of `release`."""
    return {
        "FLEET_REDIS_URL": url,
        "FLEET_BROKER_URL": broker,
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_ALLOW_SCRIPTED": "1",
        "PATH": "/usr/bin:/bin",
        **release.env(),
    }


def release_runs(
    release: Release, url: str, broker: str, workspace: Path, model: str
) -> subprocess.Popen[str]:
    """`fleet run --json` of `release`: submits a tree and waits for its end."""
    argv = [str(release.python), "-m", "fleetops.cli.main", "run", "--json", "--model", model]
    argv += ["--timeout-s", str(int(RUN_TIMEOUT_S)), "survey by the previous client"]
    return subprocess.Popen(
        argv,
        env=release_env(release, url, broker, workspace),
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def release_python(
    release: Release, url: str, broker: str, workspace: Path, code: str, *args: str
) -> str:
    """`code` run by `release`'s interpreter (exit status checked); its last line."""
    done = subprocess.run(
        [str(release.python), "-c", code, *args],
        env=release_env(release, url, broker, workspace),
        cwd=workspace,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def release_submits(release: Release, url: str, broker: str, workspace: Path, model: str) -> str:
    """`release`'s client queues a tree (no worker needed); its id."""
    code = (
        "import sys; from fleet.client import Fleet; f = Fleet.from_env();"
        "print(f.submit('queued by the previous client', model=sys.argv[1]).trace_id)"
    )
    return release_python(release, url, broker, workspace, code, model)


def release_reads(release: Release, url: str, broker: str, workspace: Path, root_id: str) -> str:
    """What `release`'s client reads of a tree: its status and its entries' statuses."""
    code = (
        "import sys; from fleet.client import Fleet; f = Fleet.from_env();"
        "t = f.wait(sys.argv[1], timeout_s=60); c = f.store.collaborators(t.trace_id);"
        "print(t.status, len(c), ','.join(sorted({e.status for e in c})))"
    )
    return release_python(release, url, broker, workspace, code, root_id)


def ended_root(process: subprocess.Popen[str]) -> str:
    """The root id a `fleet run --json` printed, once it exited 0."""
    out, err = process.communicate(timeout=RUN_TIMEOUT_S + 10)
    assert process.returncode == 0, (process.returncode, out[-2000:], err[-2000:])
    return str(json.loads(out)["trace_id"])


def release_compacts(release: Release, url: str, root_id: str, module: str) -> None:
    """`release` packs a finished tree (what its owner check does); `module` holds its
    `compact_tree` (the path moved between releases)."""
    code = (
        f"import sys, redis; from {module} import compact_tree;"
        "c = redis.Redis.from_url(sys.argv[1], decode_responses=True);"
        f"print(compact_tree(c, sys.argv[2], {RETENTION_S}))"
    )
    subprocess.run([str(release.python), "-c", code, url, root_id], check=True, cwd="/")


def current_migrates(url: str, workspace: Path) -> str:
    """`fleet migrate` of this checkout (its exit status checked), as the operator runs it."""
    env = {**os.environ, "FLEET_REDIS_URL": url}
    argv = [sys.executable, "-m", "fleetops.cli.main", "migrate"]
    done = subprocess.run(argv, env=env, cwd=workspace, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


MIXED_DB = 4
BROKERS = ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]
"""The brokers the mixed fleets run on (a fixture's params)."""


def broker_url(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    """The broker's URL for a `BROKERS` param: the test's Redis, or the shared RabbitMQ
    (held for this test module, its fleet queues purged)."""
    if request.param == "redis":
        yield database_url(redis_url, MIXED_DB)
        return
    request.getfixturevalue("rabbitmq_to_itself")
    if not rabbitmq_answers(RABBITMQ_URL):
        if os.environ.get("CI"):
            pytest.fail(f"no RabbitMQ answers at {RABBITMQ_URL}")
        pytest.skip(f"no RabbitMQ answers at {RABBITMQ_URL}")
    purge_fleet_queues(RABBITMQ_URL)
    yield RABBITMQ_URL


def store_url(redis_url: str) -> str:
    """The fleet's Redis: its own database, emptied."""
    return database_url(redis_url, MIXED_DB)
