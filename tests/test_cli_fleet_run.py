"""`fleet run|trace|stop|flower` as subprocesses against worker processes on a real Redis."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from fleet.client import Fleet
from fleetops.redis_server import free_port
from tests.fleetkit import explore_script, wait_until
from tests.procs import WorkerProcess
from tests.test_fleet_recovery import database_url, fleet_client, start_workers, survey_script

pytestmark = pytest.mark.integration

FLEET = [sys.executable, "-m", "fleetops.cli.main"]
CLI_DB = 3
EMPTY_DB = 4
"""A database no worker listens on."""
CLI_TIMEOUT_S = 60.0
SECRET = "sk-test-secret"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workspace")


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, CLI_DB)


@pytest.fixture(scope="module")
def workers(url: str, workspace: Path) -> Iterator[list[WorkerProcess]]:
    """Two thread-pool worker processes on every queue, with a provider key in their env."""
    env = {"FLEET_WORKSPACE": str(workspace), "OPENAI_API_KEY": SECRET}
    with contextlib.ExitStack() as stack:
        yield start_workers(stack, url, 2, concurrency=8, env_extra=env)


@pytest.fixture
def fleet(url: str, workspace: Path, workers: list[WorkerProcess]) -> Iterator[Fleet]:
    with fleet_client(url, url, workspace) as client:
        yield client


def cli_env(url: str, workspace: Path, **extra: str) -> dict[str, str]:
    """This environment without fleet, Flower or provider settings, plus the test fleet's."""
    drop = ("FLEET_", "FLOWER_", "OPENAI_", "ANTHROPIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    fleet = {"FLEET_REDIS_URL": url, "FLEET_WORKSPACE": str(workspace), "FLEET_ALLOW_SCRIPTED": "1"}
    return {**env, **fleet, **extra}


def fleet_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # From the workspace, as a user runs it: the checkout (fleet's own code) is no root.
    return subprocess.run(
        [*FLEET, *args],
        env=env,
        cwd=env.get("FLEET_WORKSPACE"),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fleet: error: ")
    return lines[0]


def failing_script(path: Path) -> str:
    """A main agent whose first model call fails."""
    steps = [{"raise": "the model is down"}]
    path.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]}))
    return f"scripted:{path}"


def test_run_streams_progress_and_prints_the_answer(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 3, latency_ms=50)
    result = fleet_cli(["run", "--model", model, "survey"], cli_env(url, workspace))
    assert result.returncode == 0, result.stderr
    root_id = result.stderr.splitlines()[0].removeprefix("submitted ")
    assert result.stderr.count(" started (") == 3, result.stderr
    assert result.stderr.count("✓ ") == 3, result.stderr
    assert f"[completed] {root_id}" in result.stderr
    assert result.stdout == f"{fleet.trace(root_id).answer}\n"
    assert result.stdout.startswith("summary: Explore finished: 3 branches, 3 completed.")


def test_run_json_has_the_keys_of_an_inline_run(
    url: str, workspace: Path, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 3)
    env = cli_env(url, workspace)
    via_fleet = fleet_cli(["run", "--json", "--model", model, "survey"], env)
    inline = fleet_cli(["run", "--inline", "--json", "--model", model, "survey"], env)
    assert via_fleet.returncode == 0 and inline.returncode == 0, via_fleet.stderr + inline.stderr
    out, expected = json.loads(via_fleet.stdout), json.loads(inline.stdout)
    assert out.keys() == expected.keys() >= {"trace_id", "status", "answer", "collaborators"}
    assert out["status"] == expected["status"] == "completed"
    assert out["answer"].splitlines()[0] == expected["answer"].splitlines()[0]
    assert out["stats"].keys() == expected["stats"].keys()
    assert [c.keys() for c in out["collaborators"]] == [c.keys() for c in expected["collaborators"]]
    assert {"name", "trace_id", "status", "summary"} == set(out["collaborators"][0])
    assert {c["status"] for c in out["collaborators"]} == {"completed"}
    assert all(c["trace_id"].startswith(out["trace_id"] + "@") for c in out["collaborators"])


RUN_NEEDS_NONE_OF = ("httpx", "rich", "jsonschema", "fleet.batch.run", "fleet.llm.openai")
"""What submitting and following a trace never needs: no HTTP client, no batch machinery."""


def test_run_imports_no_http_client_and_no_batch_machinery(
    url: str, workspace: Path, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 1)
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *FLEET[1:], "run", "--model", model, "survey"],
        env=cli_env(url, workspace),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert {"fleet.client", "redis"} <= imported, "the probe must see the run's imports"
    unneeded = sorted(m for m in imported if m.startswith(RUN_NEEDS_NONE_OF))
    assert unneeded == []


def test_a_failing_run_exits_1(
    url: str, workspace: Path, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    result = fleet_cli(
        ["run", "--model", failing_script(tmp_path / "m.yaml"), "survey"], cli_env(url, workspace)
    )
    assert result.returncode == 1, result.stderr
    assert "failed: " in result.stderr and "the model is down" in result.stderr
    assert result.stdout == ""


def test_run_on_an_unreachable_redis_is_one_line(workspace: Path) -> None:
    env = cli_env("redis://127.0.0.1:1", workspace)
    line = assert_one_line_error(fleet_cli(["run", "--model", "scripted:x.yaml", "survey"], env))
    assert "127.0.0.1:1" in line


def test_run_on_an_unreachable_broker_is_one_line_and_leaves_no_queued_root(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    # Live workers announced in Redis, so only the publish can find the broker gone.
    broker = f"amqp://fleet:brokerpass1@127.0.0.1:{free_port()}//"
    env = cli_env(url, workspace, FLEET_BROKER_URL=broker)
    model = explore_script(tmp_path / "m.yaml", 1)
    line = assert_one_line_error(fleet_cli(["run", "--model", model, "broker-down"], env))
    assert "cannot reach the broker at 'amqp://fleet@127.0.0.1:" in line
    assert "brokerpass1" not in line
    roots = [t for t in fleet.store.list_traces(limit=50) if t.task == "broker-down"]
    ended = [(t.status, t.run.stop_reason) for t in roots]
    assert ended == [("failed", "not_enqueued")]


def test_run_without_a_worker_on_the_main_queue_is_one_line(
    redis_url: str, workspace: Path, tmp_path: Path
) -> None:
    env = cli_env(database_url(redis_url, EMPTY_DB), workspace)
    model = explore_script(tmp_path / "m.yaml", 1)
    line = assert_one_line_error(fleet_cli(["run", "--model", model, "survey"], env))
    assert f"'fleet.main' on '{database_url(redis_url, EMPTY_DB)}'" in line, "names where it looked"


def test_run_with_no_live_worker_and_no_broker_is_one_line(
    redis_url: str, workspace: Path, tmp_path: Path
) -> None:
    broker = f"amqp://fleet:brokerpass1@127.0.0.1:{free_port()}//"
    env = cli_env(database_url(redis_url, EMPTY_DB), workspace, FLEET_BROKER_URL=broker)
    model = explore_script(tmp_path / "m.yaml", 1)
    line = assert_one_line_error(fleet_cli(["run", "--model", model, "survey"], env))
    assert "cannot reach the broker at 'amqp://fleet@127.0.0.1:" in line
    assert "brokerpass1" not in line


def test_trace_show_and_list_as_json(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 2)
    first = fleet.submit("first survey", model=model).wait(timeout_s=CLI_TIMEOUT_S)
    second = fleet.submit("second survey", model=model).wait(timeout_s=CLI_TIMEOUT_S)
    env = cli_env(url, workspace)

    shown = fleet_cli(["trace", "show", second.trace_id, "--json"], env)
    assert shown.returncode == 0, shown.stderr
    tree = json.loads(shown.stdout)
    assert tree["trace_id"] == second.trace_id and tree["status"] == "completed"
    assert len(tree["children"]) == 2
    assert {c["parent_trace_id"] for c in tree["children"]} == {second.trace_id}

    listed = fleet_cli(["trace", "list", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert all({"trace_id", "parent_trace_id", "status", "task"} <= set(row) for row in rows)
    ids = [row["trace_id"] for row in rows]
    assert ids.index(second.trace_id) < ids.index(first.trace_id), "newest first"
    assert rows[ids.index(first.trace_id)]["task"] == "first survey"
    assert all(row["parent_trace_id"] is None for row in rows)

    everything = json.loads(fleet_cli(["trace", "list", "--all", "--json"], env).stdout)
    parents = {row["trace_id"]: row["parent_trace_id"] for row in everything}
    assert [parents[c["trace_id"]] for c in tree["children"]] == [second.trace_id] * 2


@pytest.mark.parametrize(
    "args", [["trace", "show", "no-such-trace"], ["stop", "no-such-trace"], ["watch", "nope"]]
)
def test_an_unknown_trace_id_is_one_line(url: str, workspace: Path, args: list[str]) -> None:
    line = assert_one_line_error(fleet_cli(args, cli_env(url, workspace)))
    assert repr(args[-1]) in line


def all_branches_running(fleet: Fleet, root_id: str, branches: int) -> bool:
    children = fleet.store.children(root_id)
    return len(children) == branches and all(fleet.trace(c).status == "running" for c in children)


def assert_tree_stopped(fleet: Fleet, root_id: str) -> None:
    """The root and every descendant end `stopped`."""
    wait_until(
        lambda: all(fleet.trace(c).is_terminal for c in [root_id, *fleet.store.children(root_id)]),
        CLI_TIMEOUT_S,
        "the whole tree to end",
    )
    assert fleet.trace(root_id).status == "stopped"
    assert {fleet.trace(c).status for c in fleet.store.children(root_id)} == {"stopped"}


def test_stop_on_the_root_stops_every_descendant(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    # 11 model calls of 6 s (66 s a branch): longer than `fleet stop` may take to return
    # (CLI_TIMEOUT_S), so a stop that lands at all lands while every branch runs. With 1 s
    # calls a loaded machine (load 13 on 2 cores: the CLI's imports alone take 7-8 s) let
    # the tree end before the stop landed, and the root end `completed`. A working stop
    # cuts the calls in flight (`fleet.loop.cut`): the length costs only the root's first
    # call. (More turns would not help: an explore branch stops at max_iterations=15.)
    model = survey_script(tmp_path / "m.yaml", 6, latency_ms=6000, turns=10)
    handle = fleet.submit("survey", model=model)
    wait_until(lambda: all_branches_running(fleet, handle.trace_id, 6), 30, "branches to run")
    result = fleet_cli(["stop", handle.trace_id], cli_env(url, workspace))
    assert result.returncode == 0, result.stderr
    assert f"stopping 7 trace(s) under {handle.trace_id}" in result.stdout
    assert_tree_stopped(fleet, handle.trace_id)


@pytest.mark.serial
def test_events_end_soon_after_cancel_is_set_and_leave_the_tree_running(
    fleet: Fleet, tmp_path: Path
) -> None:
    model = survey_script(tmp_path / "m.yaml", 2, latency_ms=300, turns=30)
    handle = fleet.submit("cancelled follow", model=model)
    cancel = threading.Event()
    seen: list[str] = []

    def follow() -> None:
        seen.extend(event.kind for event in handle.events(CLI_TIMEOUT_S, cancel=cancel))

    follower = threading.Thread(target=follow)
    follower.start()
    wait_until(lambda: all_branches_running(fleet, handle.trace_id, 2), 30, "branches to run")
    cancelled_at = time.monotonic()
    cancel.set()
    follower.join(timeout=CLI_TIMEOUT_S)
    ended_s = time.monotonic() - cancelled_at
    assert not follower.is_alive() and seen and "finish" not in seen
    assert ended_s < 1.0, f"the follow ended {ended_s:.2f} s after cancel (reads block 200 ms)"
    assert fleet.trace(handle.trace_id).status == "waiting", "cancel stops following, not the tree"
    fleet.stop(handle.trace_id)
    assert_tree_stopped(fleet, handle.trace_id)


SIGINT_RUNS = 4
SIGINT_SEED = int(os.environ.get("FLEET_SIGNAL_SEED", "23"))
"""Seeded, so a failure replays; another seed tries other instants."""


def interrupt_run(
    url: str, workspace: Path, fleet: Fleet, model: str, rng: random.Random, signum: int
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Start `fleet run`, let its branches run, then signal it at a random instant.

    A burst of one to three signals a few ms apart: a user's second Ctrl-C, or one that
    lands while the CLI is stopping the tree after the first.
    """
    run = subprocess.Popen(
        [*FLEET, "run", "--model", model, "interrupted survey"],
        # A run that does not exit is sent SIGABRT: faulthandler prints where it hung.
        env=cli_env(url, workspace, PYTHONFAULTHANDLER="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stderr is not None
        first_line = run.stderr.readline()
        assert first_line.startswith("submitted "), first_line
        root_id = first_line.strip().removeprefix("submitted ")
        wait_until(lambda: all_branches_running(fleet, root_id, 3), 30, "branches to run")
        # The injected instant (not a wait for state): wherever the follower is, in a
        # blocking read, a pipeline's destructor, or printing a line.
        time.sleep(rng.uniform(0.0, 0.6))
        for _ in range(rng.randint(1, 3)):
            run.send_signal(signum)
            time.sleep(rng.uniform(0.002, 0.04))
        try:
            stdout, stderr = run.communicate(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGABRT)
            stdout, stderr = run.communicate()
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    return root_id, subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_at_any_instant_stops_the_run_and_exits_130(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path, signum: signal.Signals
) -> None:
    model = survey_script(tmp_path / "m.yaml", 3, latency_ms=300, turns=30)
    rng = random.Random(f"{SIGINT_SEED}-{signum}")
    for _ in range(SIGINT_RUNS):
        root_id, result = interrupt_run(url, workspace, fleet, model, rng, signum)
        assert result.returncode == 128 + signum, result.stderr
        lines = result.stderr.strip().splitlines()
        assert lines[-1] == f"interrupted: stopped {root_id}", result.stderr
        assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
        assert result.stdout == ""
        assert_tree_stopped(fleet, root_id)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def get_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_flower_lists_the_fan_out_with_trace_ids_and_no_key(
    url: str, workspace: Path, fleet: Fleet, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flower = subprocess.Popen(  # from the workspace, as a user runs it (not the checkout)
        [*FLEET, "flower", "--port", str(port)],
        env=cli_env(url, workspace),
        cwd=workspace,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Flower reports a worker online once its event consumer saw the worker's heartbeat.
        wait_until(
            lambda: all(w.name in get_text(f"{base}/metrics") for w in workers),
            CLI_TIMEOUT_S,
            "Flower to see the workers' events",
        )
        model = explore_script(tmp_path / "m.yaml", 5)
        root = fleet.submit("survey for flower", model=model).wait(timeout_s=CLI_TIMEOUT_S)
        branches = fleet.store.children(root.trace_id)

        # Each run shows its trace id, mode, parent and first words in its args (argsrepr).
        # Its name is the shadow (mode and first words) from the worker's task-received event,
        # or `fleet.run_agent` when the sender's task-sent event reaches Flower after that.
        expected = {f"('{root.trace_id}') mode=main parent=- task=": "fleet.main: survey for"}
        for i, branch in enumerate(sorted(branches), start=1):
            args = f"('{branch}') mode=explore parent={root.trace_id} task='Branch {i} "
            expected[args] = f"fleet.explore: Branch {i} of"
        expected[f"collect {root.trace_id} "] = "fleet.collect"
        tasks: dict[str, Any] = {}

        def missing() -> list[str]:
            tasks.update(get_json(f"{base}/api/tasks"))
            shown = [(str(t["args"]), str(t["name"])) for t in tasks.values()]
            return [
                args
                for args, name in expected.items()
                if not any(
                    a.startswith(args) and n.startswith((name, "fleet.run_agent")) for a, n in shown
                )
            ]

        try:
            wait_until(lambda: not missing(), 30, "Flower to list every run with its trace id")
        except AssertionError:
            raise AssertionError(f"Flower misses {missing()}: {tasks}") from None
        everything = [
            get_text(f"{base}/api/tasks"),
            get_text(f"{base}/api/workers"),
            get_text(f"{base}/metrics"),
            *(get_text(f"{base}/api/task/info/{task_id}") for task_id in tasks),
        ]
        assert all(everything)
        assert not any(SECRET in text for text in everything)
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        try:
            flower.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(flower.pid, signal.SIGKILL)
            flower.wait()


def test_a_budget_below_one_call_is_one_line_and_submits_nothing(
    url: str, workspace: Path, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    client = redis.Redis.from_url(url)
    before = trace_and_budget_ids(client)
    model = failing_script(tmp_path / "m.yaml")
    argv = ["run", "--model", model, "--budget-tokens", "1000", "survey"]

    line = assert_one_line_error(fleet_cli(argv, cli_env(url, workspace)))

    assert "budget tokens 1000 cannot pay for one call" in line and "4552" in line
    assert trace_and_budget_ids(client) <= before


def trace_and_budget_ids(client: redis.Redis) -> set[str]:
    """The trace and budget ids in Redis (the earlier tests' traces may be archived meanwhile:
    their keys change, their ids stay)."""
    keys = [*client.keys("fleet:trace:*"), *client.keys("fleet:budget:*")]
    names = [key.decode() if isinstance(key, bytes) else key for key in keys]
    return {":".join(name.split(":")[1:3]) for name in names}
