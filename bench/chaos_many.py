"""`make chaos`: several seeds of `bench/chaos.py` side by side, and their tables summed.

python bench/chaos_many.py [--faults 1000] [--processes 3] [--seed 1] [chaos.py options...]

One `chaos.py` process per seed (`--seed`, `--seed + 1`, ...), each drawing its share of
`--faults`, each with its own rig (redis-servers, Sentinels, Cluster, RabbitMQ node) and
log (`--logs`, a temporary folder by default; kept). Every other option goes to each
process as given (`--per-round 2 5 --rounds-per-backend 5 --stop-after-s 5400`, ...).
Prints each seed's progress once a minute, then every seed's table, the backends' rows
summed over the seeds (`slowest` is the slowest of any), and every failing round's replay
command; exits 1 if any seed broke an invariant. On 2 shared cores three processes fit
~1,000 faults in 70-90 minutes (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

CHAOS = Path(__file__).resolve().parent / "chaos.py"
COLUMNS = (
    "rounds",
    "trees",
    "faults",
    "stuck",
    "lost",
    "gone",
    "doubled",
    "costs off",
    "tracebacks",
    "secrets",
    "CLI errors not one line",
)
PROGRESS = re.compile(r"^\s+(\d+) faults so far$")


def table_rows(log: str) -> dict[str, list[float]]:
    """The backend rows of the table a `chaos.py` log ends with (counts, then slowest s)."""
    rows: dict[str, list[float]] = {}
    for line in log.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(COLUMNS) + 2 or not cells[1].isdigit():
            continue
        rows[cells[0]] = [float(c) for c in cells[1:-1]] + [float(cells[-1].removesuffix(" s"))]
    return rows


def summed(tables: Iterable[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Every backend's counts added over the seeds; the slowest tree the slowest of any."""
    total: dict[str, list[float]] = {}
    for rows in tables:
        for name, cells in rows.items():
            now = total.setdefault(name, [0.0] * len(cells))
            total[name] = [a + b for a, b in zip(now[:-1], cells[:-1], strict=True)] + [
                max(now[-1], cells[-1])
            ]
    return total


def markdown(rows: dict[str, list[float]]) -> str:
    """The summed table, in `chaos.py`'s columns."""
    head = "| backend | " + " | ".join(COLUMNS) + " | slowest |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for name, cells in rows.items():
        counts = " | ".join(f"{int(c):,}" for c in cells[:-1])
        lines.append(f"| {name} | {counts} | {cells[-1]:.1f} s |")
    return "\n".join(lines)


def progress(log: Path) -> int:
    """The faults a seed's log says it injected so far."""
    found = 0
    for line in log.read_text(errors="replace").splitlines():
        if match := PROGRESS.match(line):
            found = int(match.group(1))
    return found


def main(argv: list[str] | None = None) -> None:
    """Run the seeds, wait for them, print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--faults", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--logs", type=Path, default=None)
    args, passed = parser.parse_known_args(argv)
    if args.processes < 1 or args.faults < 1:
        parser.error("--processes and --faults must be at least 1")
    logs = args.logs or Path(tempfile.mkdtemp(prefix="fleet-chaos-many-"))
    logs.mkdir(parents=True, exist_ok=True)
    share = math.ceil(args.faults / args.processes)
    seeds = [args.seed + i for i in range(args.processes)]
    print(f"{len(seeds)} seeds x {share} faults, logs in {logs}", flush=True)
    started_s = time.monotonic()
    running = {}
    for seed in seeds:
        argv_ = [sys.executable, str(CHAOS), "--seed", str(seed), "--faults", str(share), *passed]
        with (logs / f"chaos-{seed}.log").open("wb") as out:
            running[seed] = subprocess.Popen(argv_, stdout=out, stderr=subprocess.STDOUT)
    try:
        while any(p.poll() is None for p in running.values()):
            time.sleep(60)
            said = ", ".join(f"seed {s}: {progress(logs / f'chaos-{s}.log')}" for s in seeds)
            print(f"{time.monotonic() - started_s:.0f} s: faults {said}", flush=True)
    except KeyboardInterrupt:
        for process in running.values():
            process.terminate()
        for process in running.values():
            process.wait()
        raise
    texts = {seed: (logs / f"chaos-{seed}.log").read_text(errors="replace") for seed in seeds}
    for seed, text in texts.items():
        print(f"\n## seed {seed} (exit {running[seed].returncode})")
        kept = ("|", "failing:", "not injected")
        print("\n".join(line for line in text.splitlines() if line.startswith(kept)))
    print(f"\n## {len(seeds)} seeds summed, {time.monotonic() - started_s:.0f} s")
    print(markdown(summed(table_rows(text) for text in texts.values())))
    sys.exit(1 if any(p.returncode for p in running.values()) else 0)


if __name__ == "__main__":
    main()
