"""Batches in the chaos: `fleet batch` files, and a provider speaking OpenAI's Batch API.

- `BatchProvider`: `tests/fake_batch.OpenAIBatchServer` answering from the round's
  scripted model file (`use`), its batches due 0.3–1.5 s after they are made. Its fault
  `malform_next()` serves the next batch's output file with hostile lines: one answer's
  usage `NaN`, one line nested 200,000 deep, a line for a custom id no batch carried. Each
  is that call's error (retried in the next batch), never the batch's or the poller's.
  `doubled(since)`: custom ids sent in two batches (a call sent twice).
- `run_file`: `fleet batch FILE --out OUT` (the CLI, as a person runs it) in the tree's
  action thread; a run a fault cut (exit 2 with a one-line error, or killed by the
  deadline) is run again with `--resume` until every entry has its results line.
  `check_file`: each entry has exactly one results line, and its root is a tree to check.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from fleet.testing import Script
from tests.fake_batch import OpenAIBatchServer

BATCH_MODEL = "batched"
"""The model alias whose calls go through `BatchProvider` (`batch_api: true`)."""
BATCH_ENV = {"FLEET_BATCH_POLL_S": "0.3", "FLEET_BATCH_FLUSH_S": "0.3"}
RESUMES = 6
"""How many times a cut `fleet batch` is run again with `--resume`."""


class BatchProvider(OpenAIBatchServer):
    """The fake Batch API, answering from the current round's script, with hostile files."""

    def __init__(self, seed: int) -> None:
        """A provider with no script yet (`use` gives each round's)."""
        super().__init__(
            Script.parse({"scripts": [{"match": ".*", "steps": [{"content": "-"}]}]}, "-")
        )
        self.hostile: Counter[str] = Counter()
        self._rng = random.Random(f"{seed}:batch")

    def use(self, script_path: Path) -> None:
        """Answer from this scripted model file from now on."""
        self.script = Script.parse(yaml.safe_load(script_path.read_text()), str(script_path))
        with self.lock:
            self.delay_s = self._rng.uniform(0.3, 1.5)

    def malform_next(self) -> None:
        """The next batch's output file carries hostile lines among its answers."""
        self.tamper_next(self._hostile_file)
        self.hostile["batch-file asked"] += 1

    def _hostile_file(self, lines: list[dict[str, Any]]) -> Iterable[bytes]:
        self.hostile["batch-file served"] += 1
        for i, line in enumerate(lines):
            if i == 0:  # this call's error: retried under its next attempt
                text = json.dumps(line).replace('"prompt_tokens": 100', '"prompt_tokens": NaN')
                yield text.encode() + b"\n"
            elif i == 1:  # nested too deep to read: its call's error too
                named = json.dumps({"custom_id": line["custom_id"]})[:-1].encode()
                yield named + b', "response": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n"
            else:
                yield json.dumps(line).encode() + b"\n"
        foreign = {"custom_id": "not-ours-1", "response": {"status_code": 200, "body": {}}}
        yield json.dumps(foreign).encode() + b"\n"

    def doubled(self, since: int) -> list[str]:
        """Custom ids sent more than once since `sent[since:]` began (whole run's counts)."""
        with self.lock:
            counts = Counter(self.sent)
            new = set(self.sent[since:])
        return [
            f"Batch API custom id {c} sent {n} times"
            for c, n in counts.items()
            if n > 1 and c in new
        ]


def write_file(path: Path, entries: list[dict[str, Any]]) -> Path:
    """The batch file (JSONL)."""
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


def run_file(
    env: dict[str, str], tasks: Path, out: Path, deadline_s: float, last: list[str]
) -> list[str]:
    """`fleet batch` until each entry has a results line (or the deadline); its problems.

    A problem: a traceback on stderr. `last` gets each run's exit status and last stderr line.
    """
    problems: list[str] = []
    for attempt in range(RESUMES + 1):
        argv = [sys.executable, "-m", "fleetops.cli.main", "batch", str(tasks)]
        argv += ["--out", str(out), "--max-in-flight", "2", "--timeout-s", "80"]
        argv += ["--resume"] if attempt else []
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            break
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=left_s)
        except subprocess.TimeoutExpired:
            break
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        last.append(f"exit {done.returncode}: {tail[:200]}")
        if "Traceback" in done.stderr:
            problems.append(f"fleet batch: a traceback: {done.stderr[-300:]!r}")
        if done.returncode in (0, 1) and len(results_of(out)) == _entries(tasks):
            break  # every task ended (1: some did not complete); else an error cut it
        time.sleep(0.5)  # cut by a fault of the round: resume once the store is back
    return problems


def _entries(tasks: Path) -> int:
    return sum(1 for line in tasks.read_text().splitlines() if line.strip())


def results_of(out: Path) -> Counter[str]:
    """Entry id -> how many results lines it has."""
    if not out.exists():
        return Counter()
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()]
    return Counter(ids)


def roots_of(out: Path) -> list[str]:
    """The trace ids the results name."""
    if not out.exists():
        return []
    return [json.loads(line)["trace_id"] for line in out.read_text().splitlines() if line.strip()]


class FileRun:
    """A `fleet batch` run in a thread: `start`, then `finish` for its problems."""

    def __init__(self, env: dict[str, str], tasks: Path, out: Path, bound_s: float) -> None:
        """Prepared, not started."""
        self.env, self.tasks, self.out, self.bound_s = env, tasks, out, bound_s
        self.problems: list[str] = []
        self.last: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Run it beside the round's faults."""
        self._thread.start()

    def _run(self) -> None:
        deadline_s = time.monotonic() + self.bound_s
        self.problems = run_file(self.env, self.tasks, self.out, deadline_s, self.last)

    def finish(self, timeout_s: float) -> bool:
        """Whether it ended within `timeout_s`."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
