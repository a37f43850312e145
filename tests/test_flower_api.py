"""Flower on the test broker, read over its HTTP API as an operator would (docs/flower.md)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fleet.client import Fleet
from fleet.errors import ConfigError
from fleet.models import Trace
from fleet.settings import Settings
from fleetops.redis_server import free_port
from tests.fleetkit import client, explore_script, fleet_settings, wait_until
from workers.app import QUEUES
from workers.naming import (
    REDACTED,
    first_words,
    shadow_name,
    task_names,
    task_repr,
    trace_page,
)

FLEET = [sys.executable, "-m", "fleetops.cli.main"]
SECRET = "sk-live-abcdefghijklmnopqrstuvwx"
"""A key-shaped word in a task: Flower must never show it."""
SEEN_TIMEOUT_S = 30.0
PAGE = "http://127.0.0.1:8600/?trace={trace_id}"


def start_flower(url: str, tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "FLOWER_"))}
    log = (tmp_path / f"flower-{port}.log").open("wb")
    process = subprocess.Popen(
        [*FLEET, "flower", "--port", str(port), *args],
        env={**clean, "FLEET_REDIS_URL": url},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return process, port


def stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def answers(http: httpx.Client, path: str) -> bool:
    try:
        return http.get(path).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def flower(worker_url: str, tmp_path: Path) -> Iterator[httpx.Client]:
    """`fleet flower` on loopback (open API), listening and receiving the fleet's events."""
    process, port = start_flower(worker_url, tmp_path)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as http:
            wait_until(lambda: answers(http, "/healthcheck"), SEEN_TIMEOUT_S, "Flower to listen")
            yield http
    finally:
        stop(process)


@pytest.fixture
def fleet(worker_fleet: Fleet) -> Fleet:
    return worker_fleet


def tasks_of(http: httpx.Client, trace_id: str) -> dict[str, dict[str, Any]]:
    reply = http.get("/api/tasks", params={"search": trace_id})
    reply.raise_for_status()
    tasks: dict[str, dict[str, Any]] = reply.json()
    return tasks


def hears(flower: httpx.Client, fleet: Fleet, model: str) -> bool:
    """Flower sees only events sent after it subscribed: True once a probe task shows up."""
    probe = fleet.submit("probe", model=model)
    probe.wait(timeout_s=30)
    try:
        wait_until(lambda: bool(tasks_of(flower, probe.trace_id)), 3.0, "the probe")
    except AssertionError:
        return False
    return True


@pytest.mark.integration
def test_flower_lists_the_tasks_of_a_trace_with_their_trace_ids(
    flower: httpx.Client, fleet: Fleet, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "model.yaml", 3)
    wait_until(lambda: hears(flower, fleet, model), SEEN_TIMEOUT_S, "Flower to hear events")

    # A client whose operator set the page's URL: its root's tasks link to the trace page.
    paged = client(
        fleet_settings(fleet.runtime.settings.redis_url, tmp_path, FLEET_TRACE_URL_TEMPLATE=PAGE)
    )
    root = paged.submit(f"Survey the repo with key {SECRET} and more words", model=model)
    assert root.wait(timeout_s=30).status == "completed"
    children = fleet.store.children(root.trace_id)
    assert len(children) == 3

    def all_succeeded() -> bool:
        tasks = tasks_of(flower, root.trace_id).values()
        return len(tasks) >= 6 and all(t["state"] == "SUCCESS" for t in tasks)

    wait_until(all_succeeded, SEEN_TIMEOUT_S, "run, 3 branches, collect and resume in Flower")
    tasks = list(tasks_of(flower, root.trace_id).values())
    runs = [t for t in tasks if "mode=" in t["args"]]
    main_runs = [t for t in runs if "mode=main" in t["args"]]
    assert len(main_runs) == 2, "the first run and the resume after collect"
    for task in main_runs:
        assert task["args"].startswith(f"('{root.trace_id}') mode=main parent=-")
    first_run = next(t for t in main_runs if t["kwargs"] != "{}")
    assert first_run["kwargs"] == f"trace_page=http://127.0.0.1:8600/?trace={root.trace_id}"
    for task in main_runs:
        assert "task='Survey the repo with key" in task["args"]
    branches = [t for t in runs if "mode=explore" in t["args"]]
    assert sorted(t["args"].split("'")[1] for t in branches) == sorted(children)
    for task in branches:
        assert f"parent={root.trace_id}" in task["args"] and task["routing_key"] == "fleet.explore"
        # The shadow name from the worker's events, or the real one if the client's
        # task-sent event reached Flower last (Celery sends that one without the shadow).
        assert task["name"] == "fleet.run_agent" or task["name"].startswith("fleet.explore: Branch")
    assert any(t["name"] == "fleet.collect" and root.trace_id in t["args"] for t in tasks)
    everything = flower.get("/api/tasks").text
    assert SECRET not in everything and REDACTED in everything

    queues = flower.get("/api/queues/length").json()["active_queues"]
    assert {q["name"] for q in queues} == set(QUEUES)
    assert all(isinstance(q["messages"], int) for q in queues)


@pytest.mark.integration
def test_flower_off_loopback_asks_for_basic_auth(worker_url: str, tmp_path: Path) -> None:
    process, port = start_flower(
        worker_url, tmp_path, "--address", "0.0.0.0", "--basic-auth", "ops:s3cret"
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as http:
            wait_until(lambda: answers(http, "/healthcheck"), SEEN_TIMEOUT_S, "Flower to listen")
            assert http.get("/api/workers").status_code == 401
            assert http.get("/api/queues/length", auth=("ops", "s3cret")).status_code == 200
    finally:
        stop(process)


@pytest.mark.parametrize(
    ("task", "shown"),
    [
        ("Summarise   the\nrepo", "Summarise the repo"),
        (
            "one two three four five six seven eight nine",
            "one two three four five six seven eight …",
        ),
        ("use sk-proj-abcdefghijklmnop now", f"use {REDACTED} now"),
        ("log in with password=hunter2 then", f"log in with {REDACTED} then"),
        ("push with ghp_abcdefghijklmnopqrstu", f"push with {REDACTED}"),
        ("the skeleton key: is fine", f"the skeleton {REDACTED} is fine"),
        # Counts and plain words that merely start like a credential name stay readable.
        ("budget tokens:400 max_tokens=4096 then", "budget tokens:400 max_tokens=4096 then"),
        ("author: keyboard:qwerty token:400", "author: keyboard:qwerty token:400"),
        ("api_key=abc123def token:4000000 x", f"{REDACTED} {REDACTED} x"),
        ("x" * 10_000, "x" * 23 + "…"),
        (
            " ".join(["abcdefghijklmnopqrstuvw"] * 8),
            ("abcdefghijklmnopqrstuvw " * 4)[:78].rstrip() + " …",
        ),
    ],
)
def test_first_words_are_few_short_and_masked(task: str, shown: str) -> None:
    assert first_words(task) == shown
    assert len(first_words(task)) <= 80


def test_task_repr_and_shadow_name_carry_mode_ids_and_words() -> None:
    child = Trace(
        trace_id="R@delegate-20261126021500-001",
        root_trace_id="R",
        parent_trace_id="R",
        mode="delegate",
        task=f"Fix the tests with token {SECRET} please and report back soon",
    )
    assert task_repr(child) == (
        "('R@delegate-20261126021500-001') mode=delegate parent=R"
        f" task='Fix the tests with token {REDACTED} please and …'"
    )
    assert shadow_name(child) == "fleet.delegate: Fix the tests with token …"
    assert task_names(child) == (task_repr(child), shadow_name(child))


def test_task_names_are_task_repr_and_shadow_name() -> None:
    """One masking pass for both names gives what two passes give."""
    rng = random.Random(14)
    words = ["a", "use", "sk-proj-abcdefghijklmnop", "key=x", "…", "x" * 30, "Aİza", "(", SECRET]
    for _ in range(2_000):
        task = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        child = Trace(trace_id="R@explore-001", root_trace_id="R", mode="explore", task=task)
        assert task_names(child) == (task_repr(child), shadow_name(child)), task


@pytest.mark.integration
def test_a_running_branch_is_started_in_flower_from_its_event_not_the_result_backend(
    flower: httpx.Client, fleet: Fleet, worker_url: str, tmp_path: Path
) -> None:
    # `task_track_started` is off (no STARTED result per task): Flower's state comes from
    # the task-started event all the same.
    wait_until(
        lambda: hears(flower, fleet, explore_script(tmp_path / "probe.yaml", 1)),
        SEEN_TIMEOUT_S,
        "Flower to hear events",
    )
    root = fleet.submit(
        "survey slowly", model=explore_script(tmp_path / "m.yaml", 2, latency_ms=1500)
    )
    started: list[dict[str, Any]] = []

    def a_branch_started() -> bool:
        tasks = tasks_of(flower, root.trace_id).values()
        started[:] = [t for t in tasks if t["state"] == "STARTED" and "mode=explore" in t["args"]]
        return bool(started)

    wait_until(a_branch_started, SEEN_TIMEOUT_S, "a branch STARTED in Flower")
    with redis.Redis.from_url(worker_url) as conn:
        assert conn.get(f"celery-task-meta-{started[0]['uuid']}") is None, "no STARTED result"
        assert fleet.trace(started[0]["args"].split("'")[1]).status in ("queued", "running")
    assert root.wait(timeout_s=60).status == "completed"


def test_a_task_links_to_its_trace_page_only_when_the_operator_set_the_template() -> None:
    trace = Trace(trace_id="R@explore-001-20261126021500-001", root_trace_id="R", task="x")
    assert trace_page(trace.trace_id, None) is None
    assert trace_page(trace.trace_id, PAGE) == (
        "trace_page=http://127.0.0.1:8600/?trace=R@explore-001-20261126021500-001"
    )
    # A hostile id cannot break out of the URL (ids are checked, and quoted here too).
    assert (
        trace_page("a b&c=<x>", PAGE)
        == "trace_page=http://127.0.0.1:8600/?trace=a%20b%26c%3D%3Cx%3E"
    )


@pytest.mark.parametrize(
    "template",
    [
        "javascript:alert(1)//{trace_id}",
        "http://h/no-id",
        "http://h/?t={trace_id} x",
        "ftp://h/{trace_id}",
    ],
)
def test_a_bad_trace_url_template_is_one_error_naming_the_variable(template: str) -> None:
    with pytest.raises(ConfigError, match="FLEET_TRACE_URL_TEMPLATE"):
        Settings.from_env({"FLEET_TRACE_URL_TEMPLATE": template})


class _HandedBack:
    """A task as `requeue` sees it: its request, a signature to send again, its events."""

    def __init__(self) -> None:
        self.request = type("Request", (), {"retries": 0})()
        self.sent: list[float | None] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def signature_from_request(self, request: Any, retries: int) -> Any:
        task = self

        class _Again:
            def apply_async(self, countdown: float | None = None) -> None:
                task.sent.append(countdown)

        return _Again()

    def send_event(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))


def test_a_handed_back_run_ends_with_a_retried_event_so_flowers_counts_add_up() -> None:
    """Processed = succeeded + failed + retried: a hand-back is no longer an execution
    that ended without an event (Flower's 42 processed, 39 succeeded, 0 failed)."""
    from celery.exceptions import Ignore

    from workers.tasks import requeue

    task = _HandedBack()
    with pytest.raises(Ignore):
        requeue(task, countdown_s=2.5, why="throttled: runs again when let in")
    assert task.sent == [2.5]
    assert task.events == [
        ("task-retried", {"exception": "throttled: runs again when let in", "traceback": ""})
    ]
