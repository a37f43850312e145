"""The checks of the features a tree's root alone does not show.

- `batch-file`: every entry of the file has exactly one results line (none: *lost*; two:
  *doubled*), `fleet batch` printed no traceback, and each entry's root is a tree checked
  as any other (ended within the bound, nothing twice, costs that add up).
- Batch API: no custom id in two provider batches (a call sent twice).
- `experience`: a completed run of the seeded experience's scope raised its `uses` (it was
  shown the rule); `successes` never pass `uses`.
- `learn`: a reflection that answered stored its one proposal exactly once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import redis

from bench.chaos_parts import invariants, workload
from bench.chaos_parts.batches import FileRun, results_of, roots_of, write_file
from bench.chaos_parts.table import Row
from bench.chaos_parts.workload import Tree
from fleet.client import Fleet
from fleet.errors import FleetError

Say = Callable[[str], None]


def start_file(tree: Tree, model: str, env: dict[str, str], folder: Path, bound_s: float) -> None:
    """Write the tree's batch file (its live entries on the round's model); run it."""
    entries = [{"model": model, **entry} for entry in tree.entries]
    tasks = write_file(folder / f"{tree.tag}.jsonl", entries)
    run = FileRun(env, tasks, folder / f"{tree.tag}.results.jsonl", bound_s)
    tree.outcome["file"] = run
    run.start()


def check_file(fleet: Fleet, tree: Tree, row: Row, deadline_s: float, label: str) -> None:
    """The batch file's results: each entry once, each entry's tree as any tree."""
    run: FileRun = tree.outcome["file"]
    if not run.finish(max(1.0, deadline_s - time.monotonic())):
        row.stuck.append(f"{label}: fleet batch {run.tasks.name} still running")
        return
    row.cli += run.problems
    counts = results_of(run.out)
    for entry in tree.entries:
        seen = counts.get(entry["id"], 0)
        if seen == 0:
            row.lost.append(f"{label}: entry {entry['id']} has no results line ({run.last})")
        elif seen > 1:
            row.doubled.append(f"{label}: fleet batch entry {entry['id']} has {seen} results lines")
    row.checked["batch-file entries with one results line"] += sum(
        1 for e in tree.entries if counts.get(e["id"]) == 1
    )
    for root_id in roots_of(run.out):
        entry_tree = dataclasses.replace(tree, root_id=root_id, action="", entries=[])
        if not invariants.wait_ended(fleet.store, root_id, deadline_s):
            row.stuck.append(f"{label}: entry root {root_id}")
            continue
        verdict = invariants.check(fleet.store, entry_tree)
        row.ended[verdict.status] += 1
        row.doubled += [f"{label} entry: {d}" for d in verdict.doubled]
        row.costs += [f"{label} entry: {c}" for c in verdict.costs]


def uses(fleet: Fleet, experience_id: str) -> tuple[int, int] | None:
    """The seeded experience's (uses, successes), None while the store is away."""
    try:
        experience = fleet.experiences.get(experience_id)
    except (FleetError, redis.RedisError, OSError):
        return None
    return experience.uses, experience.successes


def check_experiences(
    fleet: Fleet,
    trees: list[Tree],
    experience_id: str,
    before: tuple[int, int] | None,
    row: Row,
    label: str,
) -> None:
    """Retrieval counted, successes within uses, each reflection's proposal kept once."""
    after = uses(fleet, experience_id)
    shown = [t for t in trees if t.kind == "experience" and t.outcome.get("status") == "completed"]
    if after is not None and after[1] > after[0]:
        row.doubled.append(f"{label}: experience successes {after[1]} > uses {after[0]}")
    if shown and before is not None and after is not None:
        if after[0] <= before[0]:
            row.lost.append(
                f"{label}: {len(shown)} completed runs, experience uses stayed {after[0]}"
            )
        row.checked["experience uses counted"] += after[0] - before[0]
    for tree in trees:
        if tree.kind != "learn" or not tree.outcome.get("reflected"):
            continue
        kept = [
            e
            for e in fleet.experiences.all(workload.EXPERIENCE_SCOPE)
            if e.condition == f"when {tree.tag} learns"
        ]
        row.checked["reflections kept once"] += len(kept) == 1
        if len(kept) != 1:
            bucket = row.lost if not kept else row.doubled
            bucket.append(f"{label}: reflection of {tree.root_id} kept {len(kept)} proposals")
