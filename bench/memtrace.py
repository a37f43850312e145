"""Run a module under tracemalloc, a snapshot a minute: what a long-running process grows.

python -m bench.memtrace OUT_DIR MODULE [ARGS...]     (what bench/soak.py --memtrace starts)
python -m bench.memtrace --compare OLD.snap NEW.snap [--top 25]

The first form runs `python -m MODULE ARGS...` in this process with tracemalloc on (10
frames) and a daemon thread writing `OUT_DIR/<pid>-<minute>.snap` every minute. The second
prints the allocation sites that grew most between two snapshots, by traceback.
tracemalloc roughly doubles the memory a process uses and slows it: use it to find what
grows, not to measure how fast.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = 10
EVERY_S = 60.0


def snapshots(out_dir: Path) -> None:
    """Every `EVERY_S`, this process's snapshot (filtered of tracemalloc's own frames)."""
    minute = 0
    while True:
        time.sleep(EVERY_S)
        minute += 1
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        snapshot.dump(str(out_dir / f"{os.getpid()}-{minute:03d}.snap"))


def run(out_dir: Path, module: str, args: list[str]) -> None:
    """`python -m module args` here, traced."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    threading.Thread(target=snapshots, args=(out_dir,), daemon=True).start()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def compare(old: Path, new: Path, top: int) -> None:
    """The sites that grew most from `old` to `new` (size and count differences)."""
    before = tracemalloc.Snapshot.load(str(old))
    after = tracemalloc.Snapshot.load(str(new))
    total = sum(s.size for s in after.statistics("filename")) - sum(
        s.size for s in before.statistics("filename")
    )
    print(f"traced: {total / 1024:+.1f} KiB from {old.name} to {new.name}")
    for stat in after.compare_to(before, "traceback")[:top]:
        print(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
        for line in stat.traceback.format(most_recent_first=True):
            print(f"        {line}")


def main(argv: list[str] | None = None) -> int:
    """Either form (see the module's docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--compare"]:
        parser = argparse.ArgumentParser(prog="bench.memtrace --compare")
        parser.add_argument("old", type=Path)
        parser.add_argument("new", type=Path)
        parser.add_argument("--top", type=int, default=25)
        options = parser.parse_args(argv[1:])
        compare(options.old, options.new, options.top)
        return 0
    if len(argv) < 2:
        print("usage: python -m bench.memtrace OUT_DIR MODULE [ARGS...]", file=sys.stderr)
        return 2
    run(Path(argv[0]), argv[1], argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
