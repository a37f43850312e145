"""A round's workload: trees of every kind, drawn with weights, and the script they run.

Each tree's task starts with its own tag (`T3x2 explore ...`), so one scripted model file
serves the whole round: its rules match the tags. What a tree expects is kept beside it:
at most how many model turns each of its traces may write (the script's steps; a fault
must never make one more), and what the harness does to it while it runs (reply to its
question, send it a message, continue or rewind it once it ended).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos_parts import provider
from bench.chaos_parts.batches import BATCH_MODEL
from fleet.limits.budget import Budget

MCP_SERVER = "chaos"
KINDS = (
    "explore-small",
    "explore-large",
    "delegate",
    "evaluate",
    "ask-reply",
    "ask-timeout",
    "memory",
    "image",
    "budget",
    "capped",
    "message",
    "mcp-echo",
    "mcp-huge",
    "mcp-slow",
    "continue",
    "rewind",
    "provider",
    "approve",
    "deny",
    "approval-timeout",
    "batch-api",
    "batch-file",
    "mcp-relist",
    "mcp-git",
    "experience",
    "learn",
    "remote",
)
WEIGHTS = (4, 2, 2, 1, 2, 1, 2, 1, 1, 1, 2, 2, 1, 1, 1, 1, 3, 1, 1, 1, 2, 2, 1, 1, 1, 1, 2)
LISTER = "lister"
"""An MCP server (tests/mcp_raw_server.py `hang_relist`) whose re-listing never answers."""
GIT = "git"
"""The real `mcp-server-git`, on a repository of the run's own."""
REMOTE_AGENT = "reviewer"
"""A remote A2A agent (`remote_agents:` in fleet.yaml)."""
EXPERIENCE_SCOPE = "user:chaos"
SEEDED = ("when an experience task looks around", "then list the directory first")
"""The approved experience every session starts with (shares words with `experience` tasks)."""
APPROVE_RULE = {"tool": f"mcp__{MCP_SERVER}__echo", "arguments": {"text": "approve *"}}
"""fleet.yaml's `approve:` entry: an echo of `approve ...` waits for a person."""
LOOK = {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}
HUMAN_TIMEOUT_S = 3
"""How long an `ask-timeout` tree's question waits before it ends unanswered."""
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)


@dataclass
class Tree:
    """One drawn tree: how to submit it, what it may write, what to do to it."""

    tag: str
    kind: str
    rules: list[dict[str, Any]]
    turns: dict[str, int]
    """Task regex -> most assistant turns a trace of that task may write."""
    submit: dict[str, Any] = field(default_factory=dict)
    action: str = ""
    """`reply`, `send`, `continue`, `rewind`, `learn` or `batch-file` (`chaos_parts.actions`)."""
    root_id: str = ""
    entries: list[dict[str, Any]] = field(default_factory=list)
    """A `batch-file` tree's batch file (each entry a root of its own)."""
    outcome: dict[str, Any] = field(default_factory=dict)
    """What its action found (a batch file's run, a reflection's proposals)."""


def _tools(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


def _explore(tag: str, branches: int, looks: int, root_turns: int = 2) -> Tree:
    tasks = [f"{tag}b{i} look around" for i in range(branches)]
    branch = {"match": f"^{tag}b", "steps": [LOOK] * looks + [{"content": "done {task}"}]}
    root = {"match": f"^{tag} ", "steps": [_tools(("agent", {"task": tasks})), {"content": "sum"}]}
    turns = {f"^{tag}b": looks + 1, f"^{tag} ": root_turns}
    return Tree(tag, "explore", [branch, root], turns)


def _single(tag: str, steps: list[dict[str, Any]], turns: int | None = None) -> Tree:
    rule = {"match": f"^{tag} ", "steps": [*steps, {"content": "done"}]}
    return Tree(tag, "", [rule], {f"^{tag} ": turns or len(steps) + 1})


def draw(rng: random.Random, tag: str, folder: Path, only: tuple[str, ...] = ()) -> Tree:
    """One tree of a kind drawn with `WEIGHTS` (among `only` when given)."""
    kinds = [(k, w) for k, w in zip(KINDS, WEIGHTS, strict=True) if not only or k in only]
    kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
    tree = BUILDERS[kind](rng, tag, folder)
    tree.kind = kind
    return tree


Builder = Callable[[random.Random, str, Path], Tree]


def _explore_small(rng: random.Random, tag: str, folder: Path) -> Tree:
    return _explore(tag, rng.randint(1, 3), rng.randint(1, 2))


def _explore_large(rng: random.Random, tag: str, folder: Path) -> Tree:
    return _explore(tag, rng.randint(8, 16), rng.randint(1, 3))


def _capped(rng: random.Random, tag: str, folder: Path) -> Tree:
    tree = _explore(tag, rng.randint(4, 6), 1)
    tree.submit["max_concurrent"] = rng.randint(1, 2)
    return tree


def _budget(rng: random.Random, tag: str, folder: Path) -> Tree:
    """A budget that usually runs out: few tokens, few sub-agents."""
    tree = _explore(tag, rng.randint(3, 6), 3)
    # each call books its longest answer (4,096 tokens) and a tenth is kept: 4,552 at least
    tree.submit["budget"] = Budget(tokens=rng.randint(4_600, 12_000), sub_agents=rng.randint(1, 4))
    return tree


def _message(rng: random.Random, tag: str, folder: Path) -> Tree:
    tree = _explore(tag, 2, 4)
    tree.action = "send"
    return tree


def _delegate(rng: random.Random, tag: str, folder: Path) -> Tree:
    child = {"match": f"^{tag}d ", "steps": [LOOK, {"content": "delegated"}]}
    root = _single(tag, [_tools(("agent", {"task": f"{tag}d do it"}))])
    return Tree(tag, "", [child, *root.rules], {f"^{tag}d ": 2, **root.turns})


def _evaluate(rng: random.Random, tag: str, folder: Path) -> Tree:
    return _single(tag, [_tools(("evaluate", {}))])


def _ask(answered: bool) -> Builder:
    def build(rng: random.Random, tag: str, folder: Path) -> Tree:
        tree = _single(tag, [_tools(("ask_human", {"question": f"{tag} may I?"}))])
        tree.action = "reply" if answered else ""
        tree.submit["human_timeout_s"] = 60 if answered else HUMAN_TIMEOUT_S
        return tree

    return build


def _memory(rng: random.Random, tag: str, folder: Path) -> Tree:
    key = f"k{rng.randint(1, 3)}"  # a few keys: trees of a round write the same one
    write = ("memory_write", {"key": key, "value": {"by": tag}, "version": 0})
    tree = _single(tag, [_tools(write), _tools(("memory_read", {"key": key}))])
    tree.submit["memory"] = ["user:chaos"]
    return tree


def _image(rng: random.Random, tag: str, folder: Path) -> Tree:
    image = folder / f"{tag}.png"
    image.write_bytes(PNG)
    tree = _single(tag, [LOOK])
    tree.submit["images"] = [image]
    return tree


def _mcp(name: str, arguments: Callable[[random.Random], dict[str, Any]]) -> Builder:
    def build(rng: random.Random, tag: str, folder: Path) -> Tree:
        return _single(tag, [_tools((f"mcp__{MCP_SERVER}__{name}", arguments(rng)))])

    return build


def _again(action: str) -> Builder:
    """Continue (one more turn) or rewind to the task (the old branch stays: two more)."""

    def build(rng: random.Random, tag: str, folder: Path) -> Tree:
        tree = _single(tag, [LOOK], turns=3 if action == "continue" else 4)
        tree.action = action
        return tree

    return build


def _provider(rng: random.Random, tag: str, folder: Path) -> Tree:
    """An explore on the hostile OpenAI-wire provider (`chaos_parts.provider`)."""
    tree = Tree(tag, "", [], {f"^{tag} ": 2, **provider.turns()})
    tree.submit["model"] = provider.MODEL
    return tree


def _approval(action: str) -> Builder:
    """An MCP call that waits for approval: approved, denied, or left to time out."""

    def build(rng: random.Random, tag: str, folder: Path) -> Tree:
        echo = (f"mcp__{MCP_SERVER}__echo", {"text": f"approve {tag}"})
        tree = _single(tag, [_tools(echo)])
        tree.action = action
        tree.submit["human_timeout_s"] = 60 if action else HUMAN_TIMEOUT_S
        return tree

    return build


def _batch_api(rng: random.Random, tag: str, folder: Path) -> Tree:
    """An explore whose every call goes through the provider's Batch API."""
    tree = _explore(tag, rng.randint(1, 3), 1)
    tree.submit |= {"model": BATCH_MODEL, "batch_api": True}
    return tree


def _batch_file(rng: random.Random, tag: str, folder: Path) -> Tree:
    """A root, and beside it `fleet batch` of 2-4 entries (some through the Batch API)."""
    tree = _single(tag, [LOOK])
    tree.rules.insert(0, {"match": f"^{tag}e\\d", "steps": [LOOK, {"content": "entry done"}]})
    tree.turns[f"^{tag}e\\d"] = 2
    for i in range(rng.randint(2, 4)):
        entry: dict[str, Any] = {"id": f"e{i}", "task": f"{tag}e{i} look around"}
        if rng.random() < 0.5:
            entry |= {"model": BATCH_MODEL, "batch_api": True}
        tree.entries.append(entry)
    tree.action = "batch-file"
    return tree


def _experience(rng: random.Random, tag: str, folder: Path) -> Tree:
    """A run of the seeded experience's scope: it is shown it (its uses go up)."""
    tree = _single(tag, [LOOK])
    tree.submit["metadata"] = {"user": EXPERIENCE_SCOPE.split(":")[1]}
    return tree


def _learn(rng: random.Random, tag: str, folder: Path) -> Tree:
    """A run reflected on once it completed: exactly one experience proposed and kept."""
    tree = _experience(rng, tag, folder)
    proposal = {"experiences": [{"condition": f"when {tag} learns", "rule": "then look first"}]}
    reflect = {
        "match": f"^Reflect on the finished.*{tag} learn task",
        "steps": [{"content": json.dumps(proposal)}],
    }
    tree.rules.insert(0, reflect)
    tree.action = "learn"
    return tree


def _remote(rng: random.Random, tag: str, folder: Path) -> Tree:
    """A remote sub-agent over A2A (`tests/a2a_agent.py`), working 0.2-3 s."""
    seconds = round(rng.uniform(0.2, 3.0), 1)
    task = f"slow {seconds} {tag} review it"
    return _single(tag, [_tools(("agent", {"task": task, "agent": REMOTE_AGENT}))])


BUILDERS: dict[str, Builder] = {
    "explore-small": _explore_small,
    "explore-large": _explore_large,
    "delegate": _delegate,
    "evaluate": _evaluate,
    "ask-reply": _ask(answered=True),
    "ask-timeout": _ask(answered=False),
    "memory": _memory,
    "image": _image,
    "budget": _budget,
    "capped": _capped,
    "message": _message,
    "mcp-echo": _mcp("echo", lambda rng: {"text": "hello"}),
    "mcp-huge": _mcp("huge", lambda rng: {"chars": 12_000_000}),  # past the 8 MiB cap
    "mcp-slow": _mcp("slow", lambda rng: {"seconds": round(rng.uniform(1, 6), 1)}),
    "continue": _again("continue"),
    "rewind": _again("rewind"),
    "provider": _provider,
    "approve": _approval("approve"),
    "deny": _approval("deny"),
    "approval-timeout": _approval(""),
    "batch-api": _batch_api,
    "batch-file": _batch_file,
    "mcp-relist": lambda rng, tag, folder: _single(tag, [_tools((f"mcp__{LISTER}__relist", {}))]),
    "mcp-git": lambda rng, tag, folder: _single(
        tag, [_tools((f"mcp__{GIT}__git_status", {"repo_path": str(folder / "repo")}))]
    ),
    "experience": _experience,
    "learn": _learn,
    "remote": _remote,
}


def write_script(trees: list[Tree], path: Path, latency_ms: int) -> str:
    """The round's scripted model file; its model name."""
    rules = [rule for tree in trees for rule in tree.rules]
    rules.append({"match": ".*", "steps": [{"content": "verdict: met"}]})  # judges
    path.write_text(
        json.dumps({"latency_ms": latency_ms, "jitter_ms": latency_ms, "scripts": rules})
    )
    return f"scripted:{path}"


def task_of(tree: Tree) -> str:
    """The root's task."""
    return f"{tree.tag} {tree.kind} task"
