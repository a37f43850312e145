"""`Fleet.from_env()` finds the fleet as the CLI does, and never writes to a Redis nobody chose.

Before, the README's snippet run outside the `fleet up` directory used the default Redis in
silence, wrote a root there (8 keys) and waited 30 s for a worker that never came.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import fleet.settings
from fleet import Fleet
from fleet.discovery import discover
from fleet.errors import NoLiveWorkers
from fleet.llm.scripted import EXAMPLE_SCRIPT
from fleetops.discovery import read_state
from fleetops.redis_server import start_redis_server
from tests.procs import start_worker, wait_for_workers
from tests.test_cli_ops import FLEET, _kill_everything, up_env, up_state_dir, wait_for

SNIPPET = textwrap.dedent(f"""
    from fleet import Fleet

    fleet = Fleet.from_env()  # the nearest `fleet up`, as every `fleet` command finds it
    trace = fleet.submit("Survey it", model="scripted:{EXAMPLE_SCRIPT}").wait(timeout_s=120)
    print(trace.status, trace.answer)
""")


@pytest.fixture
def default_redis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[redis.Redis]:
    """A private Redis standing where the default URL points; no FLEET_* variable set."""
    for name in [n for n in os.environ if n.startswith("FLEET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("FLEET_ALLOW_SCRIPTED", "1")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    fleet.settings.forget_process_settings()
    with start_redis_server() as server:
        monkeypatch.setattr(fleet.settings, "DEFAULT_REDIS_URL", server.url)
        with redis.Redis.from_url(server.url) as client:
            yield client
    fleet.settings.forget_process_settings()


def test_no_fleet_anywhere_warns_once_and_writes_nothing(
    default_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="fleet.discovery"):
        for _ in range(2):
            with pytest.raises(NoLiveWorkers, match="nothing was written"):
                Fleet.from_env()
    (said,) = caplog.messages  # once per process, not per client
    assert "no `fleet up` for" in said and "FLEET_REDIS_URL unset" in said
    assert default_redis.dbsize() == 0


def test_the_default_redis_with_a_live_worker_is_used_after_the_warning(
    default_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(fleet.settings.DEFAULT_REDIS_URL)
    with start_worker(url, concurrency=2) as worker:
        wait_for_workers(url, [worker.name], timeout_s=60)
        with caplog.at_level(logging.WARNING, logger="fleet.discovery"):
            client = Fleet.from_env()
            trace = client.submit("Survey it", model=f"scripted:{EXAMPLE_SCRIPT}").wait(60)
    assert trace.status == "completed"
    assert [m for m in caplog.messages if "no `fleet up`" in m]


def test_a_set_url_wins_and_says_nothing(tmp_path: Path) -> None:
    found = discover({"FLEET_REDIS_URL": "redis://h:1/0"}, tmp_path)
    assert (found.source, found.note, found.settings.redis_url) == ("url", "", "redis://h:1/0")
    nothing = discover({"XDG_STATE_HOME": str(tmp_path / "s")}, tmp_path)
    assert nothing.source == "default" and str(tmp_path.resolve()) in nothing.note


def test_the_readme_snippet_below_a_fleet_up_finds_it_with_no_exports(tmp_path: Path) -> None:
    project = tmp_path / "project"
    below = project / "src" / "second"
    below.mkdir(parents=True)
    env = up_env(project, FLEET_ALLOW_SCRIPTED="1")
    up = subprocess.Popen(
        [*FLEET, "up", "--workers", "1", "--concurrency", "2"],
        env=env,
        cwd=project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    state_dir = up_state_dir(project)
    state = None
    try:
        wait_for(90, "a ready up.json", lambda: getattr(read_state(state_dir), "ready", False))
        state = read_state(state_dir)
        assert state is not None
        done = subprocess.run(
            [sys.executable, "-c", SNIPPET],
            env=env,  # no FLEET_REDIS_URL, no FLEET_STATE_DIR: only where it runs
            cwd=below,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("completed "), done.stdout
        assert "no `fleet up`" not in done.stderr
        with redis.Redis.from_url(state.redis_url) as client:
            assert client.dbsize() > 0  # the root went to the fleet's own Redis
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
    finally:
        _kill_everything(up, state)
