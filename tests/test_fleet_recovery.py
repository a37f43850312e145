"""The fleet on separate worker processes: an explore spread over two, a lost pool process,
a lost worker. Workers run with a 3 s lease and a 1 s sweep, so recovery takes seconds.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from celery import Celery

from fleet.client import Fleet
from fleet.models import now_ms
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from tests.fleetkit import client, explore_script, fleet_settings, wait_until
from tests.procs import WorkerProcess, pid_alive, start_worker, wait_for_workers

pytestmark = pytest.mark.integration

RECOVERY_DB = 1
"""A database of its own: Celery's broadcast channels are per database, so no worker of
another module answers here."""
LEASE_TTL_MS = 3_000
SWEEP_INTERVAL_S = 1.0
FAST_RECOVERY = {
    "FLEET_LEASE_TTL_MS": str(LEASE_TTL_MS),
    "FLEET_SWEEP_INTERVAL_S": str(SWEEP_INTERVAL_S),
}
CLAIM_SLACK_S = 0.5
"""A sweeper claims a lapsed lease within TTL + interval; this covers its own work."""
COLLECT_SLACK_S = 2.0
STARTUP_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 60.0


def database_url(redis_url: str, db: int) -> str:
    """The same server on database `db`, emptied."""
    url = urlsplit(redis_url)._replace(path=f"/{db}").geturl()
    with redis.Redis.from_url(url) as conn:
        conn.flushdb()
    return url


@contextlib.contextmanager
def fleet_client(broker_url: str, redis_url: str, workspace: Path) -> Iterator[Fleet]:
    """A `Fleet` client whose tasks go to `broker_url`, traces in `redis_url`."""
    fleet = client(fleet_settings(redis_url, workspace, FLEET_BROKER_URL=broker_url))
    try:
        yield fleet
    finally:
        assert isinstance(fleet.store, RedisStore)
        fleet.store.close()


@dataclass(frozen=True)
class TaskRun:
    """A run task (`fleet.run_agent`, `resume_agent`) as its workers' task events tell it."""

    task_id: str
    trace_id: str
    recovered: bool
    """Sent by a sweeper (`recovered=True`), not by a chord or a submit."""
    retries: int
    """The highest retry count a worker received it with."""
    worker: str = ""
    """The node that reported it succeeded ("" while none has)."""
    outcome: str = ""
    """The outcome its envelope reported."""

    @property
    def succeeded(self) -> bool:
        return bool(self.worker)


class TaskEvents:
    """The task events of the workers on one broker, recorded from a thread as they come.

    Run tasks store no result, so which worker ran which trace, and how often a task was
    retried, come from what every worker tells Flower: a run's task-received event carries
    its id, retry count and `argsrepr` (the trace id first, quoted), its task-succeeded
    event the node that ran it. Recorded with Celery's own `EventReceiver`, as Flower does,
    on Redis and RabbitMQ alike.
    """

    def __init__(self, broker_url: str) -> None:
        self._app = Celery("fleet-tests-events", broker=broker_url, set_as_current=False)
        self._conn = self._app.connection_for_read()
        self._events: list[dict[str, Any]] = []
        self._receiver = self._app.events.Receiver(self._conn, handlers={"*": self._events.append})
        listening = threading.Event()
        self._receiver.on_consume_ready = lambda *_, **__: listening.set()
        self._thread = threading.Thread(target=self._receiver.capture, kwargs={"wakeup": False})
        self._thread.start()
        if not listening.wait(STARTUP_TIMEOUT_S):
            raise TimeoutError("the event receiver did not start")

    def close(self) -> None:
        self._receiver.should_stop = True
        self._thread.join()
        self._conn.release()
        self._app.close()

    def ends(self, name: str) -> list[str]:
        """How each task of this name ended so far (`task-succeeded`, `task-failed`, ...).

        The chord body stores no result: its events are what says it ran.
        """
        events = list(self._events)
        ids = {e["uuid"] for e in events if e["type"] == "task-received" and e["name"] == name}
        ended = ("task-succeeded", "task-failed", "task-rejected", "task-revoked")
        return [e["type"] for e in events if e["type"] in ended and e.get("uuid") in ids]

    def runs(self) -> list[TaskRun]:
        """Every run task received so far, by task id (a retry or redelivery is the same)."""
        runs: dict[str, TaskRun] = {}
        for event in list(self._events):
            run = runs.get(event.get("uuid", ""))
            if event["type"] == "task-received" and str(event["args"])[:2] in ("('", "['"):
                retries = max(int(event.get("retries") or 0), run.retries if run else 0)
                trace_id = run.trace_id if run else str(event["args"]).split("'")[1]
                recovered = "'recovered': True" in str(event["kwargs"])
                runs[event["uuid"]] = TaskRun(event["uuid"], trace_id, recovered, retries)
            elif event["type"] == "task-succeeded" and run is not None:
                outcome = ast.literal_eval(event["result"])["outcome"]  # repr of the envelope
                runs[run.task_id] = replace(run, worker=event["hostname"], outcome=outcome)
        return list(runs.values())


def reenqueued_at_ms(log: str, trace_id: str) -> int:
    """When a worker's sweeper re-enqueued the trace: its log line's local timestamp."""
    line = next(line for line in log.splitlines() if f"re-enqueued {trace_id}:" in line)
    stamp = line[1 : line.index(": ")]  # [2026-11-26 02:39:47,249: WARNING/MainProcess] ...
    return int(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000)


def tool_results(fleet: Fleet, trace_id: str) -> list[str]:
    """The tool_call_id of every tool result message in a trace."""
    return [m.tool_call_id or "" for m in fleet.store.messages(trace_id) if m.role == "tool"]


def assert_collected_once(fleet: Fleet, root_id: str, branches: int) -> None:
    """The root completed with one explore result and every branch completed, once."""
    root = fleet.trace(root_id)
    assert root.status == "completed", root.error
    calls = [
        call["id"]
        for m in fleet.store.messages(root_id)
        if m.role == "assistant" and m.tool_calls
        for call in m.tool_calls
    ]
    assert len(calls) == 1
    assert tool_results(fleet, root_id) == calls, "the explore was collected exactly once"
    collaborators = fleet.store.collaborators(root_id)
    assert len(collaborators) == branches
    assert len({c.trace_id for c in collaborators}) == branches
    assert {c.status for c in collaborators} == {"completed"}, [
        (c.trace_id, c.status, c.summary) for c in collaborators if c.status != "completed"
    ]
    children = fleet.store.children(root_id)
    assert sorted(children) == sorted(c.trace_id for c in collaborators)
    assert all(fleet.trace(c).status == "completed" for c in children)


def usage_tokens(conn: redis.Redis) -> int:
    """Every token `fleet metrics` counted so far (all models, prompt and completion)."""
    return sum(int(value) for name, value in conn.hgetall(keys.USAGE).items() if "tokens:" in name)


def tree_tokens(fleet: Fleet, root_id: str) -> int:
    """The tokens of every model call the tree recorded (its traces' stats)."""
    traces = [fleet.trace(t) for t in [root_id, *fleet.store.children(root_id)]]
    return sum(t.stats.prompt_tokens + t.stats.completion_tokens for t in traces)


def start_workers(
    stack: contextlib.ExitStack, url: str, count: int, **options: Any
) -> list[WorkerProcess]:
    """`count` worker processes on `url`, answering pings, stopped when `stack` closes."""
    workers = [stack.enter_context(start_worker(url, **options)) for _ in range(count)]
    stack.callback(begin_shutdown, workers)  # runs first: the workers drain side by side
    broker_url = options.get("broker_url") or url
    wait_for_workers(broker_url, [w.name for w in workers], timeout_s=STARTUP_TIMEOUT_S)
    return workers


def begin_shutdown(workers: list[WorkerProcess]) -> None:
    """SIGTERM every live worker now; each one's `stop` then only waits for it."""
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):  # killed by the test already
            os.killpg(worker.pid, signal.SIGTERM)


def worker_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"FLEET_WORKSPACE": str(tmp_path), **FAST_RECOVERY, **extra}


@pytest.fixture
def url(redis_url: str) -> str:
    return database_url(redis_url, RECOVERY_DB)


@pytest.fixture
def conn(url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(url, decode_responses=True) as c:
        yield c


@pytest.fixture
def task_events(url: str) -> Iterator[TaskEvents]:
    """Recording from before the workers start."""
    recorder = TaskEvents(url)
    yield recorder
    recorder.close()


def test_an_explore_spreads_over_two_worker_processes(
    url: str, task_events: TaskEvents, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 20, latency_ms=100)
    with contextlib.ExitStack() as stack:
        a, b = start_workers(stack, url, 2, concurrency=4, env_extra=worker_env(tmp_path))
        fleet = stack.enter_context(fleet_client(url, url, tmp_path))
        trace = fleet.submit("survey", model=model).wait(timeout_s=RUN_TIMEOUT_S)
        assert_collected_once(fleet, trace.trace_id, 20)
        branches = fleet.store.children(trace.trace_id)
        wait_until(
            lambda: all(r.succeeded for r in task_events.runs()), 10, "every run's success event"
        )
    ran_on = {r.trace_id: r.worker for r in task_events.runs() if r.trace_id != trace.trace_id}
    assert set(ran_on) == set(branches)
    assert set(ran_on.values()) == {a.name, b.name}, "both workers ran branches"


@dataclass(frozen=True)
class Running:
    """A branch some process is running right now."""

    trace_id: str
    task: str
    iteration: int
    pid: int
    worker: str


def running_branches(
    fleet: Fleet, conn: redis.Redis, workers: list[WorkerProcess]
) -> list[Running]:
    """Branches under way, past their first turn: the process holding each one's lease.

    A lease's owner is `host:pid:token`; the pid is a worker (threads pool) or one of its
    pool processes (prefork).
    """
    found = []
    # One scan of /proc per look, not one per branch: under load the looks must stay quick
    # to catch a branch between its first turn and its end.
    by_pid = {pid: w for w in workers for pid in (w.pid, *w.child_pids())}
    for trace_id in map(str, conn.zrange(keys.RUNNING, 0, -1)):  # a decode_responses client
        owner = conn.get(keys.lease(trace_id))
        if not owner:
            continue
        pid = int(str(owner).split(":")[1])
        worker = by_pid.get(pid)
        trace = fleet.trace(trace_id)
        branch = trace.parent_trace_id is not None  # the root runs under a lease too
        if worker is not None and branch and trace.status == "running" and trace.iteration >= 1:
            found.append(Running(trace.trace_id, trace.task, trace.iteration, pid, worker.name))
    return found


def test_a_killed_pool_process_is_retried_and_each_branch_collected_once(
    url: str, conn: redis.Redis, task_events: TaskEvents, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 20, latency_ms=300, branch_turns=2)
    with contextlib.ExitStack() as stack:
        (worker,) = start_workers(
            stack, url, 1, pool="prefork", concurrency=4, env_extra=worker_env(tmp_path)
        )
        fleet = stack.enter_context(fleet_client(url, url, tmp_path))
        counted = usage_tokens(conn)
        handle = fleet.submit("survey", model=model)
        victims: list[Running] = []

        def pool_process_runs_a_branch() -> bool:
            pool = set(worker.child_pids())
            running = running_branches(fleet, conn, [worker])
            victims[:] = [r for r in running if r.pid in pool]
            return bool(victims)

        wait_until(pool_process_runs_a_branch, RUN_TIMEOUT_S, "a pool process mid-branch")
        victim = victims[0]
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()

        trace = handle.wait(timeout_s=RUN_TIMEOUT_S)
        elapsed_s = time.monotonic() - killed_at
        assert_collected_once(fleet, trace.trace_id, 20)
        assert not pid_alive(victim.pid)
        assert worker.process.poll() is None, "only the pool process died"
        assert victim.pid not in worker.child_pids()
        branch = fleet.store.messages(victim.trace_id)
        assert sum(m.role == "assistant" for m in branch) == 3, "resumed, not started over"

        # Celery's retry of the lost task may come after a recovered run collected: then it
        # completes the chord late, and its body must find the explore collected already.
        def retried_and_chord_done() -> bool:
            retry = [r for r in task_events.runs() if r.trace_id == victim.trace_id and r.retries]
            bodies = task_events.ends("fleet.collect")
            return bool(retry) and retry[0].succeeded and bodies == ["task-succeeded"]

        wait_until(retried_and_chord_done, RUN_TIMEOUT_S, "the retry and the chord body")
        assert_collected_once(fleet, trace.trace_id, 20)
        # The killed run's calls were counted by its resumed run, none of them twice.
        assert usage_tokens(conn) - counted == tree_tokens(fleet, trace.trace_id)
    # The victim's chord header task, retried under its own id (the sweeper's recovered run
    # of the same trace is a task of its own, never retried).
    (retried,) = [r for r in task_events.runs() if r.trace_id == victim.trace_id and r.retries]
    assert retried.retries >= 1 and retried.worker == worker.name
    print(f"pool process killed: root completed {elapsed_s:.1f} s later")


def survey_script(
    path: Path, branches: int, latency_ms: int, turns: int = 2, slow_turns: int | None = None
) -> str:
    """An explore whose branches look around for `turns` turns (branch 1: `slow_turns`).

    The looks alternate between two paths, so no branch trips the doom-loop check.
    """
    look = [{"tool_calls": [{"name": "list_dir", "arguments": {"path": p}}]} for p in (".", "./")]

    def steps(n: int) -> list[dict[str, Any]]:
        return [look[i % 2] for i in range(n)] + [{"content": "done: {task}"}]

    tasks = [f"Branch {i} of the survey" for i in range(1, branches + 1)]
    explore = {"tool_calls": [{"name": "agent", "arguments": {"task": tasks}}]}
    scripts = [
        {"match": "^Branch 1 ", "steps": steps(turns if slow_turns is None else slow_turns)},
        {"match": "^Branch", "steps": steps(turns)},
        {"match": ".*", "steps": [explore, {"content": "summary: {last_tool}"}]},
    ]
    path.write_text(json.dumps({"latency_ms": latency_ms, "scripts": scripts}))
    return f"scripted:{path}"


def test_a_killed_worker_is_recovered_by_the_survivor_within_the_lease_bound(
    url: str, conn: redis.Redis, tmp_path: Path
) -> None:
    # Branch 1 outlasts the recovery of the victim's branches: the last branch to end is
    # one whose chord header succeeded, while the chord of the victim's headers never fires.
    # 1.2 s a call: the four victims' starts spread over more than 0.6 s on a loaded machine,
    # and the moment all four are mid-turn (below) must last longer than that.
    model = survey_script(tmp_path / "m.yaml", 8, latency_ms=1200, slow_turns=13)
    with contextlib.ExitStack() as stack:
        workers = start_workers(stack, url, 2, concurrency=4, env_extra=worker_env(tmp_path))
        fleet = stack.enter_context(fleet_client(url, url, tmp_path))
        handle = fleet.submit("survey", model=model)
        victims: list[Running] = []
        slow: list[Running] = []

        def one_runs_the_slow_branch_and_the_other_is_busy_mid_turn() -> bool:
            running = running_branches(fleet, conn, workers)
            slow[:] = [r for r in running if r.task.startswith("Branch 1 ")]
            if not slow:
                return False
            victims[:] = [r for r in running if r.worker != slow[0].worker]
            # Every slot of the victim holds a leased branch with two model calls to go, so
            # none can end and let the worker take a message it has not leased yet.
            return len(victims) == 4 and all(r.iteration == 1 for r in victims)

        wait_until(
            one_runs_the_slow_branch_and_the_other_is_busy_mid_turn, RUN_TIMEOUT_S, "a full victim"
        )
        victim = next(w for w in workers if w.name == victims[0].worker)
        survivor = next(w for w in workers if w is not victim)
        victim.kill()
        killed_ms = now_ms()

        root = handle.wait(timeout_s=RUN_TIMEOUT_S)
        done_s = (now_ms() - killed_ms) / 1000
        assert_collected_once(fleet, root.trace_id, 8)
        for v in victims:  # resumed from their persisted turns, not started over
            assert sum(m.role == "assistant" for m in fleet.store.messages(v.trace_id)) == 3

        def since_kill_s(at_ms: int | None) -> float:
            return ((at_ms or 0) - killed_ms) / 1000

        slow_done_s = since_kill_s(fleet.trace(slow[0].trace_id).finished_at_ms)
        victims_done_s = [since_kill_s(fleet.trace(v.trace_id).finished_at_ms) for v in victims]
        assert max(victims_done_s) < slow_done_s, "the scenario: a chord member ended last"
        fired = list(conn.scan_iter("celery-taskset-meta-*.fc"))  # the join's claim or mark
        assert fired == [], "the lost headers' chord never fired"
        log = survivor.log()
    assert not pid_alive(victim.pid)
    claimed_s = sorted(since_kill_s(reenqueued_at_ms(log, v.trace_id)) for v in victims)
    print(f"whole worker killed: re-enqueued after {claimed_s} s, root done after {done_s:.1f} s")
    assert claimed_s[-1] < LEASE_TTL_MS / 1000 + SWEEP_INTERVAL_S + CLAIM_SLACK_S
    # A recovered branch collected within one look (a lease TTL) after the last one ended.
    assert done_s < slow_done_s + LEASE_TTL_MS / 1000 + COLLECT_SLACK_S
