"""`fleet metrics`: the text format, each reading against a real Redis, and a scrape of the
running command while an explore runs on a real worker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from fleet.models import Message, Mode, Trace
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from fleetops.metrics import (
    Family,
    FleetMetrics,
    kombu_queue_lengths,
    make_server,
    redis_queue_lengths,
    render,
    running_by_queue,
    traces_by_status,
    usage_families,
)
from tests.fleetkit import explore_script, wait_until
from tests.procs import WorkerProcess, start_worker
from workers import probes
from workers.app import QUEUES

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai:gpt-4o-mini"
NO_KEYS = {"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""}
"""Belt and braces for subprocesses: without a key no real model can be reached."""


def parse(text: str) -> dict[str, float]:
    """`name{labels}` -> value of every sample line."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_render_writes_the_text_exposition_format() -> None:
    families = [
        Family("fleet_x_total", "counter", "Back\\slash and\nnewline.", {(): 3.0}),
        Family(
            "fleet_y",
            "gauge",
            "Labelled.",
            {(("model", 'a"b\\c\nd'),): 0.25, (("model", "plain"),): 7.0},
        ),
    ]
    assert render(families) == (
        "# HELP fleet_x_total Back\\\\slash and\\nnewline.\n"
        "# TYPE fleet_x_total counter\n"
        "fleet_x_total 3\n"
        "# HELP fleet_y Labelled.\n"
        "# TYPE fleet_y gauge\n"
        'fleet_y{model="a\\"b\\\\c\\nd"} 0.25\n'
        'fleet_y{model="plain"} 7\n'
    )


@pytest.mark.integration
def test_redis_queue_lengths_count_every_priority_list_as_kombu_does(
    redis_url: str, redis_client: redis.Redis
) -> None:
    from kombu.connection import Connection

    with Connection(redis_url) as connection:
        for priority in (0, 0, 5, 9):
            queue = connection.SimpleQueue("fleet.explore")
            queue.put({"n": priority}, priority=priority)
            queue.close()
        channel = connection.default_channel
        by_kombu = channel.queue_declare(queue="fleet.explore", passive=True).message_count
    lengths = redis_queue_lengths(redis_client, QUEUES)
    assert lengths == {
        "fleet.main": 0,
        "fleet.delegate": 0,
        "fleet.explore": 4,
        "fleet.evaluate": 0,
    }
    assert by_kombu == 4


def test_other_brokers_are_read_with_a_passive_queue_declare() -> None:
    from kombu.connection import Connection

    declared, never = f"fleet.test-{uuid.uuid4().hex}", f"fleet.test-{uuid.uuid4().hex}"
    with Connection("memory://") as connection:  # in-process, like any non-Redis transport
        queue = connection.SimpleQueue(declared)
        queue.put({"n": 1})
        queue.put({"n": 2})
        assert kombu_queue_lengths("memory://", [never, declared]) == {never: 0, declared: 2}
        queue.close()


@pytest.mark.integration
@pytest.mark.rabbitmq
def test_rabbitmq_queue_lengths_survive_queues_that_were_never_declared() -> None:
    from kombu.connection import Connection

    url = os.environ.get("FLEET_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
    declared, never = f"fleet.test-{uuid.uuid4().hex}", f"fleet.test-{uuid.uuid4().hex}"
    try:
        with Connection(url, connect_timeout=2) as connection:
            queue = connection.SimpleQueue(declared, queue_opts={"auto_delete": True})
            queue.put({"n": 1})
    except OSError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no RabbitMQ answers at {url}")
    try:  # a refused passive declare closes its channel: the next queue must still be read
        lengths = kombu_queue_lengths(url, [never, declared, never])
        assert lengths == {never: 0, declared: 1}
    finally:
        with Connection(url, connect_timeout=2) as connection:
            connection.default_channel.queue_delete(declared)


def test_model_turns_add_to_the_fleet_wide_usage_when_the_run_ends(
    redis_db: redis.Redis,
) -> None:
    store = RedisStore(redis_db)
    store.create_trace(Trace(trace_id="t", root_trace_id="t", task="x"))
    store.update_trace("t", status="running")
    for _ in range(2):
        store.append_message(
            Message(
                trace_id="t",
                role="assistant",
                model=MODEL,
                prompt_tokens=10,
                completion_tokens=4,
                cost_usd=0.00125,
            )
        )
    store.append_message(Message(trace_id="t", role="tool", content="no model, no usage"))
    assert usage_families(redis_db)[0].samples == {}, "counted when the run ends"
    assert redis_db.hexists(keys.trace("t"), "uncounted")
    store.update_trace("t", status="completed")  # the run's last write
    store.update_trace("t", status="completed")  # nothing left to count
    tokens, cost = usage_families(redis_db)
    assert tokens.samples == {
        (("kind", "prompt"), ("model", MODEL)): 20.0,
        (("kind", "completion"), ("model", MODEL)): 8.0,
    }
    assert cost.samples == {(("model", MODEL),): pytest.approx(0.0025)}
    assert not redis_db.hexists(keys.trace("t"), "uncounted"), "a trace at rest has none"


def test_cached_tokens_add_to_the_fleet_wide_usage_and_an_older_entry_still_counts(
    redis_db: redis.Redis,
) -> None:
    store = RedisStore(redis_db)
    store.create_trace(Trace(trace_id="t", root_trace_id="t", task="x"))
    store.update_trace("t", status="running")
    # what a writer from before cached tokens left: three numbers per model
    redis_db.hset(keys.trace("t"), "uncounted", json.dumps({MODEL: [5, 1, 0.001]}))
    turn = Message(trace_id="t", role="assistant", model=MODEL, prompt_tokens=10)
    store.append_message(turn.model_copy(update={"cached_tokens": 8, "completion_tokens": 2}))
    store.update_trace("t", status="completed")

    tokens, _ = usage_families(redis_db)

    assert tokens.samples == {
        (("kind", "prompt"), ("model", MODEL)): 15.0,
        (("kind", "completion"), ("model", MODEL)): 3.0,
        (("kind", "cached"), ("model", MODEL)): 8.0,
    }


def test_running_traces_count_by_the_queue_of_their_mode(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    modes: list[tuple[str, Mode]] = [
        ("r", "main"),
        ("r@a", "explore"),
        ("r@b", "explore"),
        ("r@c", "explore"),
    ]
    for trace_id, mode in modes:
        store.create_trace(Trace(trace_id=trace_id, root_trace_id="r", mode=mode, task="x"))
    store.update_trace("r@c", status="completed")
    for trace_id in ("r", "r@a", "r@b"):
        assert store.acquire_lease(trace_id, "owner", ttl_ms=60_000)
    store.acquire_lease("r@c", "owner", ttl_ms=1)  # a dead runner: its deadline passes
    at_ms = int(redis_db.zscore(keys.RUNNING, "r@c") or 0) + 1
    assert running_by_queue(redis_db, at_ms) == {"fleet.main": 1, "fleet.explore": 2}
    assert traces_by_status(redis_db, at_ms) == {"queued": 3, "completed": 1}


@pytest.mark.integration
def test_every_metric_the_dashboard_and_the_scalers_query_is_exported(redis_url: str) -> None:
    metrics = FleetMetrics(Settings.from_env({"FLEET_REDIS_URL": redis_url}))
    try:
        exported = {family.name for family in metrics.collect()}
    finally:
        metrics.close()
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for path in (ROOT / "deploy" / "k8s" / "base").glob("worker-*.yaml"):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj["kind"] == "ScaledObject":
                queries += [t["metadata"]["query"] for t in obj["spec"]["triggers"]]
    used = {name for query in queries for name in re.findall(r"\bfleet_\w+", query)}
    assert used and used <= exported, used - exported


def test_a_counter_that_cannot_be_written_is_only_logged() -> None:
    with RedisStore.from_url("redis://127.0.0.1:1/0") as store:  # nothing listens on port 1
        store.count("resumes")


def test_a_scrape_without_redis_is_an_error_response_not_a_crash() -> None:
    metrics = FleetMetrics(Settings.from_env({"FLEET_REDIS_URL": "redis://127.0.0.1:1/0"}))
    server = make_server(metrics, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"{base}/metrics", timeout=30)
        assert failed.value.code == 503
        failed.value.close()
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
            assert response.status == 200  # liveness does not depend on Redis
    finally:
        server.shutdown()
        server.server_close()
        metrics.close()


# -- the command, during an explore ----------------------------------------------


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(response.read().decode())


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def fleet(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fleetops.cli.main", *argv],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def small_worker(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[WorkerProcess]:
    """One worker on every queue with two threads (so branches queue up); fast sweeps."""
    env = {
        "FLEET_WORKSPACE": str(tmp_path),
        "FLEET_SWEEP_INTERVAL_S": "0.2",
        probes.PROBE_DIR_ENV: str(tmp_path / "probes"),
        **NO_KEYS,
    }
    with start_worker(redis_url, concurrency=2, env_extra=env) as worker:
        wait_until(
            lambda: probes.check(tmp_path / "probes", ready=True, max_age_s=60) is None,
            30,
            "the worker to be ready",
        )
        yield worker


@pytest.mark.integration
def test_a_scrape_during_an_explore_shows_queued_and_running_sub_agents(
    redis_url: str, small_worker: WorkerProcess, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 6, latency_ms=300, branch_turns=2)
    store = RedisStore.from_url(redis_url)
    store.create_trace(  # a run whose worker died: the sweeper must count its expiry
        Trace(trace_id="dead", root_trace_id="dead", mode="explore", task="Branch 0", model=model)
    )
    store.acquire_lease("dead", "gone", ttl_ms=1)
    store.close()
    env = {**os.environ, "FLEET_REDIS_URL": redis_url, "FLEET_WORKSPACE": str(tmp_path), **NO_KEYS}
    port = free_port()
    server = fleet(["metrics", "--port", str(port)], env, tmp_path)
    run = fleet(["run", "--json", "--model", model, "survey"], env, tmp_path)
    try:
        wait_until(
            lambda: _both_positive(port, '{queue="fleet.explore"}'),
            30,
            "a scrape with queued and running explore branches",
        )
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0 and json.loads(out)["status"] == "completed", err
        final = scrape(port)
        assert final[f'fleet_tokens_total{{kind="prompt",model="{model}"}}'] > 0
        assert final['fleet_traces{status="completed"}'] >= 7
        assert final["fleet_resumes_total"] >= 1
        wait_until(lambda: scrape(port)["fleet_lease_expiries_total"] >= 1, 10, "a sweep")
    finally:
        for process in (run, server):
            process.kill()
            process.communicate()


def _both_positive(port: int, labels: str) -> bool:
    try:
        samples = scrape(port)
    except OSError:  # not listening yet
        return False
    queued = samples.get(f"fleet_queue_length{labels}", 0)
    return queued > 0 and samples.get(f"fleet_running_subagents{labels}", 0) > 0
