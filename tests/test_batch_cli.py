"""`fleet batch` as a user runs it: a subprocess against a real Redis and a real worker."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from fleet.batch.journal import sidecar_path
from fleet.models import Trace
from fleet.storage.backends.redis.store import RedisStore
from tests.fleetkit import wait_until
from tests.procs import read_until_exit, start_worker, wait_for_workers

pytestmark = pytest.mark.integration

FLEET = [sys.executable, "-m", "fleetops.cli.main"]
WORKER_DB = 11
"""A database of its own, so `require_workers` sees this module's worker only."""
CLI_TIMEOUT_S = 100.0  # 200 tasks of 1 s through 20 (12.5 s quiet), on a loaded machine
SCRIPT = """latency_ms: {latency_ms}
scripts:
  - {{match: '^fail', steps: [{{raise: boom}}]}}
  - {{match: '.*', steps: [{{content: 'answer: {{task}}'}}]}}
"""


@pytest.fixture(scope="module")
def worker_url(redis_url: str) -> Iterator[str]:
    url = urlsplit(redis_url)._replace(path=f"/{WORKER_DB}").geturl()
    with redis.Redis.from_url(url) as admin:
        admin.flushdb()
    with start_worker(url, concurrency=32) as worker:
        wait_for_workers(url, [worker.name], timeout_s=30)
        yield url


@pytest.fixture
def store(worker_url: str) -> Iterator[RedisStore]:
    """The trace store, emptied of traces (the broker's keys stay: the worker needs them)."""
    with redis.Redis.from_url(worker_url) as admin:
        stale = list(admin.scan_iter("fleet:*", count=1000))
        if stale:
            admin.delete(*stale)
    with RedisStore.from_url(worker_url) as trace_store:
        yield trace_store


def write_batch(path: Path, count: int, *, fail: Collection[int] = ()) -> Path:
    lines = [
        json.dumps({"id": f"t{i:03d}", "task": f"{'fail' if i in fail else 'task'} {i}"})
        for i in range(1, count + 1)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def model(tmp_path: Path, latency_ms: int = 0) -> str:
    script = tmp_path / "model.yaml"
    script.write_text(SCRIPT.format(latency_ms=latency_ms))
    return f"scripted:{script}"


def env(url: str, tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return {
        **clean,
        "FLEET_REDIS_URL": url,
        "FLEET_WORKSPACE": str(tmp_path),
        "FLEET_ALLOW_SCRIPTED": "1",
    }


def fleet_batch(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLEET, "batch", *args],
        env=env(url, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def start_batch(url: str, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*FLEET, "batch", *args],
        env=env(url, tmp_path),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def result_lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def roots(store: RedisStore) -> list[Trace]:
    return [t for t in store.list_traces(10_000) if t.parent_trace_id is None]


class WindowSampler:
    """Counts unfinished roots in the store, over and over, while a batch runs."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            unfinished = sum(1 for t in roots(self.store) if not t.is_terminal)
            self.peak = max(self.peak, unfinished)
            self.samples += 1

    def __enter__(self) -> WindowSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def max_overlap(traces: list[Trace]) -> int:
    """Most roots alive at one instant, from their created/finished times (finish first on ties)."""
    points = [(t.created_at_ms, 1) for t in traces]
    points += [(t.finished_at_ms or 2**62, -1) for t in traces]
    alive = peak = 0
    for _, delta in sorted(points):
        alive += delta
        peak = max(peak, alive)
    return peak


def test_200_tasks_through_a_window_of_20(
    worker_url: str, store: RedisStore, tmp_path: Path
) -> None:
    batch = write_batch(tmp_path / "tasks.jsonl", 200)
    out = tmp_path / "results.jsonl"
    args = [
        str(batch),
        "--out",
        str(out),
        "--max-in-flight",
        "20",
        "--model",
        model(tmp_path, 1000),
    ]
    started = time.monotonic()
    with WindowSampler(store) as sampler:
        result = fleet_batch(worker_url, tmp_path, *args)
    elapsed_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    lines = result_lines(out)
    assert len(lines) == 200
    assert sorted(str(line["id"]) for line in lines) == [f"t{i:03d}" for i in range(1, 201)]
    assert {line["status"] for line in lines} == {"completed"}
    assert 10 <= sampler.peak <= 20, f"peak {sampler.peak} over {sampler.samples} samples"
    assert max_overlap(roots(store)) <= 20
    rate = f"{200 / elapsed_s:.0f} tasks/s"
    print(f"\n200 tasks in {elapsed_s:.1f} s ({rate}); peak in flight {sampler.peak}")
    assert "[200/200]" in result.stdout and "batch summary" in result.stdout


def test_killed_batch_resumes_without_running_a_task_twice(
    worker_url: str, store: RedisStore, tmp_path: Path
) -> None:
    batch = write_batch(tmp_path / "tasks.jsonl", 200)
    out = tmp_path / "results.jsonl"
    args = [str(batch), "--out", str(out), "--max-in-flight", "20", "--model", model(tmp_path, 60)]
    first = start_batch(worker_url, tmp_path, *args)
    try:
        wait_until(lambda: len(result_lines(out)) >= 100, 60, "half the results")
    finally:
        first.kill()
        first.communicate()
    finished = {str(line["id"]) for line in result_lines(out)}
    submitted = {
        row["id"]
        for row in map(json.loads, sidecar_path(out).read_text().splitlines())
        if "id" in row
    }
    assert submitted - finished, "some tasks were in flight when the batch was killed"
    again = fleet_batch(worker_url, tmp_path, *args, "--resume")
    assert again.returncode == 0, again.stderr
    lines = result_lines(out)
    assert len(lines) == 200
    assert Counter(str(line["id"]) for line in lines) == {f"t{i:03d}": 1 for i in range(1, 201)}
    per_entry = Counter(str(t.run.batch_entry) for t in roots(store))
    assert per_entry == {f"t{i:03d}": 1 for i in range(1, 201)}, "one root per task"
    assert {t.stats.messages for t in roots(store)} == {1}, "each model answered once"


def test_ctrl_c_stops_submitting_and_resume_finishes(
    worker_url: str, store: RedisStore, tmp_path: Path
) -> None:
    batch = write_batch(tmp_path / "tasks.jsonl", 30)
    out = tmp_path / "results.jsonl"
    args = [str(batch), "--out", str(out), "--max-in-flight", "4", "--model", model(tmp_path, 150)]
    first = start_batch(worker_url, tmp_path, *args)
    wait_until(lambda: len(result_lines(out)) >= 4, 60, "the first results")
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=CLI_TIMEOUT_S)
    assert first.returncode == 130, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    assert len(roots(store)) < 30, "submitting stopped"
    again = fleet_batch(worker_url, tmp_path, *args, "--resume")
    assert again.returncode == 0, again.stderr
    assert len(result_lines(out)) == 30
    assert Counter(str(t.run.batch_entry) for t in roots(store)).most_common(1)[0][1] == 1


def test_a_bad_line_17_exits_2_and_submits_nothing(
    worker_url: str, store: RedisStore, tmp_path: Path
) -> None:
    batch = write_batch(tmp_path / "tasks.jsonl", 30)
    lines = batch.read_text().splitlines()
    lines[16] = '{"id": "t017", "task": "x", "priority": "high"}'
    batch.write_text("\n".join(lines) + "\n")
    out = tmp_path / "results.jsonl"
    result = fleet_batch(
        worker_url, tmp_path, str(batch), "--out", str(out), "--model", model(tmp_path)
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"{batch}:17: unknown key 'priority'" in result.stderr
    assert store.list_traces() == [] and not out.exists()


def test_dry_run_and_bad_options_submit_nothing(
    worker_url: str, store: RedisStore, tmp_path: Path
) -> None:
    batch = write_batch(tmp_path / "tasks.yaml", 0)
    batch.write_text("- task: one\n- id: two\n  task: two\n  preset: nope\n")
    checked = fleet_batch(worker_url, tmp_path, str(batch), "--dry-run", "--model", model(tmp_path))
    assert checked.returncode == 2 and f"{batch}:2: " in checked.stderr and "nope" in checked.stderr
    batch.write_text("- task: one\n- id: two\n  task: two\n")
    checked = fleet_batch(worker_url, tmp_path, str(batch), "--dry-run", "--model", model(tmp_path))
    assert checked.returncode == 0 and "2 task(s) OK" in checked.stdout
    resume_alone = fleet_batch(worker_url, tmp_path, str(batch), "--resume")
    assert resume_alone.returncode == 2 and "--resume needs --out" in resume_alone.stderr
    assert store.list_traces() == []


def test_workspace_flag_places_entries_that_name_none(worker_url: str, tmp_path: Path) -> None:
    root = tmp_path / "projects"
    (root / "app").mkdir(parents=True)
    batch = write_batch(tmp_path / "tasks.jsonl", 2)
    flags = [str(batch), "--dry-run", "--model", model(tmp_path)]
    base = {**env(worker_url, tmp_path), "FLEET_WORKSPACE_ROOTS": str(root)}
    base.pop("FLEET_WORKSPACE")

    def fleet_batch_in(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*FLEET, "batch", *args],
            env=base,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )

    refused = fleet_batch_in(*flags)  # the default workspace (.) lies outside the roots
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    placed = fleet_batch_in(*flags, "--workspace", str(root / "app"))
    assert placed.returncode == 0 and "2 task(s) OK" in placed.stdout, placed.stderr


def test_a_failed_task_exits_1_with_a_summary(
    worker_url: str, store: RedisStore, tmp_path: Path
) -> None:
    batch = write_batch(tmp_path / "tasks.jsonl", 12, fail={5})
    result = fleet_batch(worker_url, tmp_path, str(batch), "--model", model(tmp_path))
    assert result.returncode == 1, result.stderr
    assert "failed    t005" in result.stdout and "boom" in result.stdout
    summary = result.stdout[result.stdout.index("batch summary") :]
    assert "completed" in summary and "11" in summary and "✗ t005 failed" in summary


def test_on_a_terminal_it_draws_a_progress_bar(
    worker_url: str, store: RedisStore, tmp_path: Path
) -> None:
    batch = write_batch(tmp_path / "tasks.jsonl", 10)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*FLEET, "batch", str(batch), "--max-in-flight", "3", "--model", model(tmp_path, 50)],
        env={**env(worker_url, tmp_path), "COLUMNS": "160", "TERM": "xterm"},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    screen = read_until_exit(controller, process, CLI_TIMEOUT_S)
    assert process.returncode == 0, screen
    for part in ("batch", "10/10", "ETA", "done 10", "failed 0", "running", "queued", "sub-agents"):
        assert part in screen, part


def test_batch_api_on_a_provider_without_one_is_refused_in_one_line(
    worker_url: str, store: RedisStore, tmp_path: Path
) -> None:
    batch = tmp_path / "tasks.yaml"
    batch.write_text("- task: one\n- task: two\n  batch_api: false\n")
    scripted = model(tmp_path)
    refused = fleet_batch(worker_url, tmp_path, str(batch), "--batch-api", "--model", scripted)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert f"{batch}:1: " in refused.stderr and "has no batch API" in refused.stderr
    batch.write_text("- task: one\n  batch_api: false\n")  # an entry may opt out
    checked = fleet_batch(
        worker_url, tmp_path, str(batch), "--batch-api", "--dry-run", "--model", scripted
    )
    assert checked.returncode == 0, checked.stderr
    assert store.list_traces() == []


def test_progress_shows_the_calls_in_provider_batches() -> None:
    from fleet.batch.run import BatchCounts
    from fleetops.cli.batch import counts_text

    assert "provider batches" not in counts_text(BatchCounts(total=3))
    text = counts_text(BatchCounts(total=3, in_batches=12, oldest_batch_s=95.0))
    assert text.endswith("in provider batches 12 (oldest 95 s)")
