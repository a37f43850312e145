"""What must hold after every round, and the counts of what did not.

- *stuck*: a tree (root, every descendant, every collaborator entry) not ended within the
  bound; its diagnosis names each trace's status, lease, stop flag and run state, and what
  the owner check would do with it (an unowned trace shows as a remedy).
- *costs off*: a trace's token totals not its turns' sums, a budget that counted fewer
  tokens than the tree's turns spent (more is a call paid for and not written: `_budget`),
  or tokens still reserved once the tree ended.
- *doubled*: a tool result beyond one per tool call on a trace's main path, a child entry
  collected twice, or a trace with more model turns than its script has (a write of a
  runner that was fenced out, or a turn run twice).
- *lost*: a tree whose root a fault took (a Redis SIGKILL loses up to a second of writes,
  a promoted replica what it had not received): counted apart, as *gone*, when Redis
  itself lost it. The proof is a marker the harness writes in the root's slot once the
  root is submitted (`mark`), a key the fleet never touches: gone with the root, Redis
  lost that data; still there with the root gone, the fleet lost the root (*lost*, an
  invariant broken).
- *tracebacks*, *secrets*: lines of the workers' logs.
- *cli*: a `fleet` command given a wrong id must fail in one line, with no traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.chaos_parts.workload import Tree
from fleet import owners
from fleet.errors import FleetError, TraceNotFound
from fleet.history import main_path
from fleet.limits.capability import budget_state
from fleet.models import Message, Trace
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.gone import present
from fleet.storage.keys.layout import tree_id
from fleet.storage.store import TraceStore

SECRETS_ENV = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
CANARY = "sk-chaos-canary-6f1d2e9a0b7c"
"""The API keys the workers are given: never in a log, whatever a fault does."""


@dataclass
class Verdict:
    """One tree's outcome."""

    status: str
    doubled: list[str] = field(default_factory=list)
    costs: list[str] = field(default_factory=list)
    """A trace whose totals differ from its model turns', a budget not what they spent."""


def tree_ended(store: TraceStore, root_id: str) -> bool:
    """Every trace of the tree and every collaborator entry of the root ended."""
    try:
        if not owners.tree_ended(store, root_id):
            return False
        entries = store.collaborators(root_id)
    except TraceNotFound:
        return True
    except (redis.RedisError, OSError):  # the store is coming back from a fault
        return False
    return all(e.status in ("completed", "failed", "stopped") for e in entries)


def wait_ended(store: TraceStore, root_id: str, deadline_s: float) -> bool:
    """Poll until the tree ended or the monotonic `deadline_s` passed."""
    while not tree_ended(store, root_id):
        if time.monotonic() > deadline_s:
            return False
        time.sleep(0.1)
    return True


def marker(root_id: str) -> str:
    """The harness's key in the root's slot (the tree's hash tag in the cluster layout)."""
    return f"chaos-marker:{tree_id(root_id)}"


def mark(store: TraceStore, root_id: str) -> None:
    """Write the root's marker, right after its submission (see *lost*)."""
    redis_client(store).set(marker(root_id), "1", ex=3600)


def redis_client(store: TraceStore) -> redis.Redis:
    """The Redis client under a fleet store."""
    assert isinstance(store, RedisStore), store
    return store.client


def check(store: TraceStore, tree: Tree) -> Verdict:
    """The ended tree's status and everything in it written twice."""
    try:
        root = store.get_trace(tree.root_id)
    except TraceNotFound:
        kept = redis_client(store).exists(marker(tree.root_id))
        return Verdict("lost" if kept else "gone")
    verdict = Verdict(root.status)
    spent = 0
    frontier = [root]
    while frontier:
        trace = frontier.pop()
        messages = store.messages(trace.trace_id)
        verdict.doubled += _doubled(store, tree, trace, messages)
        verdict.costs += _totals(trace, messages)
        spent += sum(m.prompt_tokens + m.completion_tokens for m in messages)
        frontier += present(store, store.children(trace.trace_id))[0]  # a gone child: none
    costs = _budget(store, tree.root_id, spent)
    verdict.costs += [
        f"{c} (root {root.status}: {root.error or root.run.stop_reason})" for c in costs
    ]
    return verdict


def _totals(trace: Trace, messages: list[Message]) -> list[str]:
    """The trace's running token totals are its model turns' sums."""
    turns = [m for m in messages if m.role == "assistant"]
    prompt = sum(m.prompt_tokens for m in turns)
    completion = sum(m.completion_tokens for m in turns)
    stats = trace.stats
    if (stats.prompt_tokens, stats.completion_tokens) == (prompt, completion):
        return []
    return [
        f"{trace.trace_id}: totals {stats.prompt_tokens}+{stats.completion_tokens} tokens,"
        f" its turns {prompt}+{completion}"
    ]


def _budget(store: TraceStore, root_id: str, spent: int) -> list[str]:
    """A budget's tokens used cover what the tree's turns spent, nothing left reserved.

    Not equal: the budget counts every call the provider answered or read, the turns only
    those written. A cut call is settled at the prompt it was booked with
    (docs/messages.md), an answer whose write a stop refused (`StopLanded`) or a lost
    lease fenced (a frozen worker thawed after its run was recovered) at its usage, and a
    failover may lose a turn's write after its settle (a suffix of the writes): each was
    paid for and none is a turn (make chaos seed 40 round 15: 39 used, no turn written).
    Fewer used than spent is a turn the budget never counted.
    """
    state = budget_state(store, root_id)
    if state is None:
        return []
    found = []
    if state.used_tokens < spent:
        found.append(f"{root_id}: budget used {state.used_tokens} tokens, turns spent {spent}")
    if state.reserved_tokens:
        found.append(f"{root_id}: {state.reserved_tokens} tokens still reserved after the end")
    return found


def _doubled(store: TraceStore, tree: Tree, trace: Trace, messages: list[Message]) -> list[str]:
    path = main_path(messages, trace.head_sequence)
    calls = [m.tool_call_id for m in path if m.role == "tool"]
    found = [
        f"{trace.trace_id}: tool result of call {c} twice" for c in set(calls) if calls.count(c) > 1
    ]
    entries = [e.trace_id for e in store.collaborators(trace.trace_id)]
    found += [
        f"{trace.trace_id}: collaborator entry {e} twice"
        for e in set(entries)
        if entries.count(e) > 1
    ]
    task = next((str(m.content) for m in messages if m.role == "user"), "")
    limit = next((n for regex, n in tree.turns.items() if re.search(regex, task)), None)
    turns = sum(1 for m in messages if m.role == "assistant")
    if limit is not None and turns > limit:
        found.append(f"{trace.trace_id}: {turns} model turns, the script has {limit}")
    return found


def describe(store: TraceStore, root_id: str) -> str:
    """A stuck tree, trace by trace, and what the owner check would do with each."""
    lines = [f"stuck tree {root_id}:"]
    try:
        ids = [root_id, *store.children(root_id)]
        for trace in store.get_traces(ids):
            lines.append(
                f"  {trace.trace_id} {trace.status} it={trace.iteration}"
                f" lease={store.lease_holder(trace.trace_id)}"
                f" stop={store.stop_requested(trace.trace_id)}"
                f" run={trace.run.model_dump(exclude_defaults=True)}"
            )
        lines += [f"  entry {e.trace_id} {e.status}" for e in store.collaborators(root_id)]
    except (FleetError, redis.RedisError, OSError) as exc:
        lines.append(f"  (cannot read it: {exc})")
    return "\n".join(lines)


def log_findings(logs: list[Path], seen: dict[Path, int]) -> tuple[list[str], list[str]]:
    """New tracebacks and secret lines in `logs` since `seen` (offsets, updated).

    A traceback is named by the log line before it and its last line (the exception).
    """
    tracebacks: list[str] = []
    secrets: list[str] = []
    for path in logs:
        with path.open("rb") as log:
            log.seek(seen.get(path, 0))
            lines = log.read().decode(errors="replace").splitlines()
            seen[path] = log.tell()
        tracebacks += _tracebacks(path.name, lines)
        secrets += [
            f"{path.name}: a secret in {line[:60]!r}..."
            for line in lines
            if any(secret in line for secret in _secrets())
        ]
    return tracebacks, secrets


def _tracebacks(name: str, lines: list[str]) -> list[str]:
    found: list[str] = []
    for i, line in enumerate(lines):
        if not line.startswith("Traceback (most recent call last)"):
            continue
        if i and lines[i - 1].startswith("During handling"):
            continue  # a chained one: named with the first
        said = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].startswith("[")), "")
        end = next(
            (lines[j] for j in range(i + 1, len(lines)) if lines[j] and lines[j][0] not in " \t"),
            "",
        )
        found.append(f"{name}: {said[-120:]} -> {end[:160]}")
    return found


def _secrets() -> tuple[str, ...]:
    from bench.chaos_parts.backends import REDIS_PASSWORD

    return (CANARY, REDIS_PASSWORD)


def cli_error(env: dict[str, str], args: list[str]) -> str | None:
    """None if `fleet ARGS` fails in one line without a traceback; else what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr:
        return None
    return f"fleet {' '.join(args)}: exit {done.returncode}, stderr {done.stderr[-400:]!r}"
