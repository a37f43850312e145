"""Where a run's time goes on the worker before its first request: a timestamp per point.

    BENCH_TIMELINE_DIR=/tmp/tl BENCH_WORKER_IMPORTS=bench.timeline_probe \\
        python bench/branch_cost_bench.py --quick
    python bench/timeline_probe.py /tmp/tl

Loaded into the bench's workers (`bench.harness.workers` imports `BENCH_WORKER_IMPORTS`),
it writes one line per point to `DIR/<pid>.log`: Celery's `task_received` and
`task_prerun`, the entry and exit of the functions in `POINTS`, and httpx's
`Client.send`. A point is keyed by its run (a fleet run's trace id, a plain task's
text); a point on another thread (the model call's spare thread) is given to the last
run whose `cuttable` started in that process before it. Run with one sample in flight at
a time (as the bench's latency rows do): the attribution is by order. The printout: per
point, the median of its offset from the run's `task_received`, fleet runs and plain
tasks apart (issue 40's timeline in docs/performance.md was read this way).
"""

from __future__ import annotations

import functools
import importlib
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

POINTS = (
    "fleet.storage.backends.redis.store:RedisStore.begin_run",
    "fleet.loop.fenced_run:FencedRun.drive",
    "fleet.loop.fenced_run:ask_model",
    "fleet.loop.call:cuttable",
    "fleet.llm.openai:OpenAIClient.complete",
    "fleet.loop.toolcalls:sub_agents",
    "fleet.loop.toolcalls:dispatch",
    "fleet.storage.backends.redis.store:RedisStore.create_traces",
    "workers.dispatch:send_chord",
)
"""`module:attribute` of every function timed, where its caller looks it up."""

_local = threading.local()
_lock = threading.Lock()


def _writer(folder: Path) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    return (folder / f"{os.getpid()}.log").open("a", buffering=1)


def install(folder: Path) -> None:
    """Time `POINTS`, the task signals and httpx's sends into `folder`."""
    from celery import signals

    out = _writer(folder)

    def mark(label: str, key: str | None = None) -> None:
        at = time.time()
        with _lock:
            out.write(f"{at:.6f} {key or getattr(_local, 'key', '-')} {label}\n")

    def received(request: Any = None, **_: Any) -> None:
        mark("received", f"id:{request.id}")

    def prerun(task_id: str = "", task: Any = None, args: Any = (), **_: Any) -> None:
        run = args[0] if task.name == "fleet.run_agent" else args[2] if len(args) > 2 else task_id
        _local.key = str(run).replace(" ", "_")
        mark(f"prerun:{task_id}")

    signals.task_received.connect(received, weak=False)
    signals.task_prerun.connect(prerun, weak=False)
    for spec in (*POINTS, "httpx:Client.send"):
        _time(spec, mark)


def _time(spec: str, mark: Any) -> None:
    module, attribute = spec.split(":")
    *path, name = attribute.split(".")
    owner: Any = importlib.import_module(module)
    for part in path:
        owner = getattr(owner, part)
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args: Any, **kwargs: Any) -> Any:
        mark(f"{name}>")
        try:
            return inner(*args, **kwargs)
        finally:
            mark(f"{name}<")

    setattr(owner, name, timed)


def report(folder: Path) -> None:
    """Each point's median offset from its run's `received`, fleet and plain apart."""
    offsets: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, points in _firsts(_lines(folder)).items():
        if "received" not in points:
            continue
        kind = "fleet" if key[:8].isdigit() else "plain"
        for label, at in points.items():
            offsets[kind][label].append(1000 * (at - points["received"]))
    for kind, found in offsets.items():
        print(kind)
        for label, values in sorted(found.items(), key=lambda p: statistics.median(p[1])):
            print(f"  {label:40s} {statistics.median(values):8.2f} ms  (n={len(values)})")
    spans(folder)


SPANS = (("cuttable>", "complete>"), ("complete<", "cuttable<"), ("cuttable>", "cuttable<"))
"""The model call's hand-over and hand-back, timed per run (a difference of medians is not
the median of the differences)."""


def spans(folder: Path) -> None:
    """Per fleet run, the time between each pair of `SPANS`: p50 and p90.

    `complete` is on the run's thread, or on the call's (` (call thread)`): either is read.
    """
    runs = [p for k, p in _firsts(_lines(folder)).items() if k[:8].isdigit()]
    print("fleet, per run")
    for start, end in SPANS:
        for a, b in {(start, end), (_on_call(start), _on_call(end))}:
            found = sorted(1000 * (p[b] - p[a]) for p in runs if a in p and b in p)
            if found:
                p90 = found[int(len(found) * 0.9)]
                print(f"  {a} -> {b}: p50 {statistics.median(found):.2f} ms, p90 {p90:.2f} ms")


def _on_call(label: str) -> str:
    return f"{label} (call thread)" if label.startswith("complete") else label


def _lines(folder: Path) -> list[tuple[float, str, str, str]]:
    lines = []
    for log in folder.glob("*.log"):
        for line in log.read_text().splitlines():
            at, key, label = line.split(" ", 2)
            lines.append((float(at), log.stem, key, label))
    return sorted(lines)


def _firsts(lines: list[tuple[float, str, str, str]]) -> dict[str, dict[str, float]]:
    """Each run's first time at each point (a call thread's points given to its run)."""
    runs = {label[7:]: key for _, _, key, label in lines if label.startswith("prerun:")}
    first: dict[str, dict[str, float]] = defaultdict(dict)
    cut: dict[str, str] = {}  # the last run whose call left, by process
    for at, pid, key, label in lines:
        label = "prerun" if label.startswith("prerun:") else label
        if key.startswith("id:"):
            key = runs.get(key[3:], key)
        elif key == "-" and pid in cut:
            key, label = cut[pid], f"{label} (call thread)"
        if label == "cuttable>":
            cut[pid] = key
        first[key].setdefault(label, at)
    return first


if (_folder := os.environ.get("BENCH_TIMELINE_DIR")) and __name__ != "__main__":
    install(Path(_folder))

if __name__ == "__main__":
    report(Path(sys.argv[1]))
