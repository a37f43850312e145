"""The Compose services' commands as local processes (no containers) on a local Redis.

Each service runs exactly its `command` from deploy/docker-compose.yml as `fleet ...`, with
the environment of deploy/example.env pointed at the test Redis. What differs from a
container: one host for every process, so node names (`-n explore@%h`) of a second replica
get a suffix, Flower and metrics get free ports, and each worker its own probe directory.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from fleet.models import Trace
from fleet.storage.backends.redis.store import RedisStore
from tests.fleetkit import wait_until
from tests.procs import WorkerProcess
from workers import probes

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
QUEUE_SERVICES = ("main", "delegate", "explore", "evaluate")
START_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 60.0


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(
        (DEPLOY / "docker-compose.yml").read_text()
    )["services"]
    return services


def example_env() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (DEPLOY / "example.env").read_text().splitlines())
    return {p[0]: p[1] for p in pairs if len(p) == 2 and not p[0].startswith("#")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    """`argv` with `option`'s value replaced."""
    i = argv.index(option)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


class LocalCompose:
    """Starts Compose services as `fleet` processes; `close` stops them all at once."""

    def __init__(self, redis_url: str, workdir: Path, model: str) -> None:
        self.workdir = workdir
        self.services = compose_services()
        self.auth = f"fleet:{secrets.token_hex(8)}"
        self.env = {
            **os.environ,
            **example_env(),
            "FLEET_REDIS_URL": redis_url,
            "FLEET_WORKSPACE": str(workdir),
            "FLEET_MODEL": model,  # and no provider key: nothing can reach a real model
            "OPENAI_API_KEY": "",
            "ANTHROPIC_API_KEY": "",
            "FLOWER_BASIC_AUTH": self.auth,
            "PYTHONUNBUFFERED": "1",
        }
        self.procs: list[WorkerProcess] = []

    def start(self, service: str, argv: list[str] | None = None) -> WorkerProcess:
        """Run the service's command (or `argv`) as `python -m fleetops.cli.main ...`."""
        argv = argv or self.services[service]["command"]
        node = argv[argv.index("-n") + 1].partition("@")[0] if "-n" in argv else service
        env = {**self.env, probes.PROBE_DIR_ENV: str(self.workdir / "probes" / node)}
        fd, log_name = tempfile.mkstemp(prefix=f"fleet-{node}-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "fleetops.cli.main", *argv],
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(WorkerProcess(process, node, Path(log_name)))
        return self.procs[-1]

    def probe_dir(self, proc: WorkerProcess) -> Path:
        return self.workdir / "probes" / proc.name

    def wait_ready(self, *procs: WorkerProcess) -> None:
        """Until each worker wrote its ready file (`fleet probe --ready` would pass)."""
        for proc in procs:
            wait_until(partial(self._ready_or_dead, proc), START_TIMEOUT_S, proc.name)
            assert proc.process.poll() is None, proc.log()

    def _ready_or_dead(self, proc: WorkerProcess) -> bool:
        ready = probes.check(self.probe_dir(proc), ready=True, max_age_s=60) is None
        return ready or proc.process.poll() is not None

    def close(self) -> None:
        for proc in self.procs:  # all at once, so the warm shutdowns overlap
            if proc.process.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            proc.stop()
            proc.log_path.unlink(missing_ok=True)


@pytest.fixture
def compose(redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> Iterator[LocalCompose]:
    """Nothing runs yet; tests start the services they need. A flushed Redis."""
    local = LocalCompose(redis_url, tmp_path, slow_explore_script(tmp_path / "model.yaml"))
    yield local
    local.close()


def slow_explore_script(path: Path, branches: int = 4, looks: int = 1, latency_ms: int = 0) -> str:
    """A scripted main agent exploring `branches` tasks; each branch looks `looks` times."""
    paths = [".", "./"]  # alternate, or three equal calls in a row stop it as a doom loop
    look = [
        {"tool_calls": [{"name": "list_dir", "arguments": {"path": paths[i % 2]}}]}
        for i in range(looks)
    ]
    tasks = [f"Branch {i} of the survey" for i in range(1, branches + 1)]
    main = [{"tool_calls": [{"name": "agent", "arguments": {"task": tasks}}]}]
    scripts = [
        {"match": "^Branch", "steps": [*look, {"content": "done: {task}"}]},
        {"match": ".*", "steps": [*main, {"content": "summary: {last_tool}"}]},
    ]
    path.write_text(yaml.safe_dump({"latency_ms": latency_ms, "scripts": scripts}))
    return f"scripted:{path}"


def fleet_run(compose: LocalCompose, *, wait: bool = True) -> subprocess.Popen[str]:
    """`fleet run --json "survey"` as a user would type it, against the local fleet."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetops.cli.main", "run", "--json", "survey"],
        env=compose.env,
        cwd=compose.workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if wait:
        process.wait(RUN_TIMEOUT_S)
    return process


def finished_run(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    assert process.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def http_get(port: int, path: str, auth: str | None) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
            return response.status, json.loads(body) if path.startswith("/api") else body
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return 0, None


def test_the_compose_services_run_an_explore_across_queue_workers(
    compose: LocalCompose,
) -> None:
    workers = [compose.start(name) for name in QUEUE_SERVICES]
    port = free_port()
    flower_argv = with_option(compose.services["flower"]["command"], "--port", str(port))
    flower = compose.start("flower", flower_argv)
    metrics_port = free_port()
    compose.start(
        "metrics", with_option(compose.services["metrics"]["command"], "--port", str(metrics_port))
    )
    serve_port = free_port()
    compose.start(
        "serve", with_option(compose.services["serve"]["command"], "--port", str(serve_port))
    )
    compose.wait_ready(*workers)
    wait_until(lambda: http_get(port, "/healthcheck", None)[0] == 200, 30, "Flower")
    wait_until(lambda: http_get(metrics_port, "/healthz", None)[0] == 200, 30, "metrics")
    wait_until(lambda: http_get(serve_port, "/healthz", None)[0] == 200, 30, "fleet serve")

    result = finished_run(fleet_run(compose))

    assert result["status"] == "completed", result
    assert [c["status"] for c in result["collaborators"]] == ["completed"] * 4
    assert http_get(port, "/api/tasks", None)[0] == 401, "Flower's API needs the login"

    def ran_on() -> set[str]:
        tasks = http_get(port, "/api/tasks", compose.auth)[1] or {}
        return {t["worker"].partition("@")[0] for t in tasks.values() if t["state"] == "SUCCESS"}

    wait_until(lambda: {"main", "explore"} <= ran_on(), 15, "Flower to list tasks per worker")
    assert flower.process.poll() is None
    traces = f"http://127.0.0.1:{serve_port}/api/traces/{result['trace_id']}"
    assert httpx.get(traces, timeout=5).status_code == 401, "fleet serve needs its token"
    bearer = {"Authorization": f"Bearer {compose.env['FLEET_SERVE_TOKEN']}"}
    shown = httpx.get(traces, headers=bearer, timeout=5).json()
    assert [c["status"] for c in shown["collaborators"]] == ["completed"] * 4
    status, text = http_get(metrics_port, "/metrics", None)
    assert status == 200 and 'fleet_traces{status="completed"} 5' in text.decode()
    explore = workers[QUEUE_SERVICES.index("explore")]
    env = {**compose.env, probes.PROBE_DIR_ENV: str(compose.probe_dir(explore))}
    for probe in (["--max-age-s", "60"], ["--ready"]):  # as the kubelet runs them
        argv = [sys.executable, "-m", "fleetops.cli.main", "probe", *probe]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout


def branch_traces(store: RedisStore, root_id: str) -> list[Trace]:
    return [store.get_trace(c) for c in store.children(root_id)]


def statuses_seen(store: RedisStore, root_id: str, trace_id: str) -> list[str]:
    events = store.read_events(root_id, count=10_000)
    return [e.status or "" for _, e in events if e.trace_id == trace_id and e.kind == "trace"]


def test_sigterm_to_the_explore_worker_hands_its_branches_to_another(
    compose: LocalCompose, redis_url: str
) -> None:
    looks = 13  # the explore preset allows 15 turns
    compose.env["FLEET_MODEL"] = slow_explore_script(
        compose.workdir / "slow.yaml", branches=4, looks=looks, latency_ms=700
    )
    main, first = compose.start("main"), compose.start("explore")
    compose.wait_ready(main, first)
    run = fleet_run(compose, wait=False)
    store = RedisStore.from_url(redis_url)
    try:
        wait_until(lambda: len(store.list_traces(10)) >= 5, 30, "the explore to fan out")
        root = next(t for t in store.list_traces(10) if t.parent_trace_id is None)
        wait_until(
            lambda: all(b.iteration >= 1 for b in branch_traces(store, root.trace_id)),
            30,
            "every branch to run on the first explore worker",
        )
        booted_s, turns = start_second_replica(compose, store, root.trace_id, looks)
        handback_s, exited_ms = sigterm(compose, first)

        result = finished_run(run)
        assert result["status"] == "completed", result
        check_collected_once(store, root.trace_id, looks, exited_ms)
        assert handback_s < 10, f"the worker took {handback_s:.1f} s to hand its work back"
        print(f"2nd worker up in {booted_s:.1f} s; turns {turns}; SIGTERM->exit {handback_s:.2f} s")
    finally:
        store.close()
        if run.poll() is None:
            run.kill()
            run.communicate()


def start_second_replica(
    compose: LocalCompose, store: RedisStore, root_id: str, looks: int
) -> tuple[float, list[int]]:
    """Scale explore up by one (a second node name on this host); its boot time and the
    turns each branch had done on the first replica by then."""
    argv = with_option(compose.services["explore"]["command"], "-n", "explore-2@%h")
    booted = time.monotonic()
    compose.wait_ready(compose.start("explore", argv))
    turns = [b.iteration for b in branch_traces(store, root_id)]
    assert max(turns) <= looks, f"branches ended before the second worker was up: {turns}"
    return time.monotonic() - booted, turns


def sigterm(compose: LocalCompose, worker: WorkerProcess) -> tuple[float, int]:
    """SIGTERM one worker as Compose or the kubelet would; seconds to its exit, exit time."""
    stopped_at = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(probes.SOFT_SHUTDOWN_WINDOW_S) == 0, worker.log()
    handback_s = time.monotonic() - stopped_at
    gone = compose.probe_dir(worker)
    assert probes.check(gone, ready=True, max_age_s=60) == "worker not ready"
    assert probes.check(gone, ready=False, max_age_s=60) == "no heartbeat yet"
    return handback_s, int(time.time() * 1000)


def check_collected_once(store: RedisStore, root_id: str, looks: int, exited_ms: int) -> None:
    """One tool result for the explore call, each branch completed once, on the new worker."""
    messages = store.messages(root_id)
    (call,) = [c for m in messages if m.tool_calls for c in m.tool_calls]
    results = [m for m in messages if m.role == "tool"]
    assert [m.tool_call_id for m in results] == [call["id"]]
    assert "4 branches, 4 completed" in (results[0].content or "")
    collaborators = store.collaborators(root_id)
    assert len({c.trace_id for c in collaborators}) == len(collaborators) == 4
    assert {c.status for c in collaborators} == {"completed"}
    for branch in branch_traces(store, root_id):
        roles = [m.role for m in store.messages(branch.trace_id)]
        # Exactly one model turn per step of the script: no turn ran twice.
        assert roles.count("assistant") == looks + 1 and roles.count("tool") == looks
        assert branch.finished_at_ms is not None and branch.finished_at_ms > exited_ms
        seen = statuses_seen(store, root_id, branch.trace_id)
        assert "queued" in seen[seen.index("running") :], f"{branch.trace_id} never yielded"
    assert store.expired_leases(int(time.time() * 1000) + 10**9) == []


def test_the_liveness_probe_fails_once_the_heartbeat_is_stale(tmp_path: Path) -> None:
    heartbeat = probes.HeartbeatFile(tmp_path, interval_s=3600)
    assert probes.check(tmp_path, ready=False, max_age_s=60) == "no heartbeat yet"
    heartbeat.start()
    beat_s = (tmp_path / probes.ALIVE_FILE).stat().st_mtime
    assert probes.check(tmp_path, ready=False, max_age_s=60, now_s=beat_s + 59) is None
    stale = probes.check(tmp_path, ready=False, max_age_s=60, now_s=beat_s + 61)
    assert stale == "heartbeat is 61 s old (limit 60 s)"
    probes.mark_ready(tmp_path)
    assert probes.check(tmp_path, ready=True, max_age_s=60) is None
    probes.mark_ready(tmp_path, ready=False)
    heartbeat.stop()
    assert probes.check(tmp_path, ready=True, max_age_s=60) == "worker not ready"
    assert not (tmp_path / probes.ALIVE_FILE).exists()
