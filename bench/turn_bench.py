"""A branch's turns as a worker pays for them: CPU per explore branch, in one process.

python bench/turn_bench.py [--branches 300] [--rounds 5] [--against TREE] [--profile FILE]

On a private redis-server, without Celery: the root's spawn turn (create the children,
announce them, wait), each branch's `Runner.run` (2 scripted model turns, `list_dir`
between them) and the collect (`settling.settle`, as the chord body calls it). Printed:
the CPU of this process (`time.process_time`) per branch for each phase, the median of
`--rounds` explores (after one warm-up explore).

`--against TREE` (a checkout of another commit, e.g. `git archive main | tar -x -C TREE`)
compares: each round runs this file once in this tree and once in TREE, alternated, each a
fresh process with this tree's venv (`--tree` puts a tree first on `sys.path`), and the
medians of both are printed side by side. Under `valgrind --tool=callgrind` (one round,
`--rounds 1`), the instruction counts of runs of N and 2N branches differ by N branches'.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
PHASES = ("spawn", "branch", "collect")


def one_explore(runtime: Any, recorder: Any, model: str) -> dict[str, float]:
    """CPU ms per branch of each phase of one explore."""
    from fleet.children import settling
    from fleet.conversation.roots import TaskSpec, create_root
    from fleet.loop.runner import Runner

    root = create_root(runtime, TaskSpec("survey", model))
    runner = Runner(runtime)
    cpu: dict[str, float] = {}
    start = time.process_time()
    assert runner.run(root.trace_id).outcome == "waiting"
    cpu["spawn"] = time.process_time() - start
    request = recorder.requests.pop()
    start = time.process_time()
    for child in request.child_ids:
        assert runner.run(child).outcome == "completed"
    cpu["branch"] = time.process_time() - start
    start = time.process_time()
    settled = settling.settle(
        runtime, request.parent_trace_id, request.tool_call_id, request.child_ids
    )
    assert isinstance(settled, settling.Settled) and settled.turn_complete
    cpu["collect"] = time.process_time() - start
    n = len(request.child_ids)
    return {phase: s * 1000 / n for phase, s in cpu.items()}


def measure(branches: int, rounds: int, profile: Path | None = None) -> list[dict[str, float]]:
    """`rounds` explores of `branches` branches after a warm-up; CPU ms per branch each."""
    from fleet.runtime import Runtime
    from fleet.settings import Settings
    from fleet.storage.backends.redis.store import RedisStore
    from fleetops.redis_server import start_redis_server
    from tests.fleetkit import RecordingDispatcher, explore_script

    rows: list[dict[str, float]] = []
    with (
        start_redis_server() as server,
        tempfile.TemporaryDirectory() as tmp,
        RedisStore.from_url(server.url) as store,
    ):
        workdir = Path(tmp)
        recorder = RecordingDispatcher()
        runtime = Runtime.build(Settings(workspace=workdir, allow_scripted=True), store, recorder)
        one_explore(runtime, recorder, explore_script(workdir / "warm.yaml", 20))
        model = explore_script(workdir / "model.yaml", branches)
        profiler = cProfile.Profile() if profile else None
        for _ in range(rounds):
            if profiler:
                profiler.enable()
            rows.append(one_explore(runtime, recorder, model))
            if profiler:
                profiler.disable()
            store.client.flushdb()
        if profiler and profile:
            profiler.dump_stats(profile)
    return rows


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    """The median of each phase, and of their sum."""
    out = {phase: statistics.median(r[phase] for r in rows) for phase in PHASES}
    out["total"] = statistics.median(sum(r[p] for p in PHASES) for r in rows)
    return out


def one_round(tree: Path, branches: int) -> dict[str, float]:
    """Three explores in a fresh process running on `tree`; their medians."""
    command = [sys.executable, __file__, "--tree", str(tree), "--json"]
    command += ["--rounds", "3", "--branches", str(branches)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def compare(against: Path, branches: int, rounds: int) -> None:
    """Alternate fresh processes on both trees; print the medians side by side."""
    trees = {"this": HERE, "against": against}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            samples[name].append(one_round(tree, branches))
    print(f"# CPU ms per branch, {branches} branches, medians of {rounds} alternated processes")
    print(f"# this={HERE} against={against}")
    for phase in (*PHASES, "total"):
        this, other = (statistics.median(s[phase] for s in samples[k]) for k in trees)
        print(f"{phase:>8}  against {other:7.3f}  this {this:7.3f}  ratio {this / other:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--branches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another tree to alternate with")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the rounds here")
    parser.add_argument("--tree", type=Path, default=HERE, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    if args.against:
        compare(args.against.resolve(), args.branches, args.rounds)
        return
    result = medians(measure(args.branches, args.rounds, args.profile))
    if args.json:
        print(json.dumps(result))
        return
    print(f"# CPU ms per branch, {args.branches} branches, medians of {args.rounds}")
    for phase, ms in result.items():
        print(f"{phase:>8} {ms:7.3f}")


if __name__ == "__main__":
    main()
