"""`fleet watch`: the tree state from events, its rendering, and the command on a live fleet."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from fleet.client import Fleet
from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessDispatcher
from fleet.loop.runner import Runner
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleetops.watch_view import MAX_CHILDREN_SHOWN, TreeState, render, row_text
from tests.fleetkit import explore_script
from tests.procs import read_until_exit

FLEET = [sys.executable, "-m", "fleetops.cli.main"]
CLI_TIMEOUT_S = 100.0
WATCH_S = "90"
"""How long `fleet watch` follows a tree (its Python and the worker are slow when loaded)."""


def inline_runtime(tmp_path: Path, branches: int) -> tuple[Runtime, str]:
    model = explore_script(tmp_path / "model.yaml", branches, branch_turns=2)
    settings = Settings(workspace=tmp_path, allow_scripted=True)
    return Runtime.build(settings, MemoryStore(), InProcessDispatcher()), model


def screen(renderable: object) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_events_grow_the_tree_with_status_iteration_tokens_and_last_tool(tmp_path: Path) -> None:
    runtime, model = inline_runtime(tmp_path, 3)
    root = create_root(runtime, TaskSpec("survey", model))
    state = TreeState(runtime.store, root.trace_id)
    assert list(state.nodes) == [root.trace_id] and state.nodes[root.trace_id].status == "queued"
    Runner(runtime).run(root.trace_id)
    for _, event in runtime.store.read_events(root.trace_id):
        state.apply(event)
    children = runtime.store.children(root.trace_id)
    assert state.children[root.trace_id] == children
    for child in children:
        node = state.nodes[child]
        assert (node.status, node.iteration, node.last_tool) == ("completed", 3, "list_dir")
        assert node.tokens > 0 and state.depth(child) == 1
    top = state.nodes[root.trace_id]
    assert (top.status, top.iteration, top.last_tool) == ("completed", 2, "agent")
    text = screen(render(state))
    assert text.splitlines()[0].startswith("main  completed  it 2")
    for index in (1, 2, 3):
        assert f"explore-00{index}  completed  it 3" in text and "last list_dir" in text
    assert row_text(top).endswith(root.trace_id)


def test_a_snapshot_of_a_finished_tree_matches_the_replayed_one(tmp_path: Path) -> None:
    runtime, model = inline_runtime(tmp_path, 2)
    root = create_root(runtime, TaskSpec("survey", model))
    Runner(runtime).run(root.trace_id)
    snapshot = TreeState(runtime.store, root.trace_id)
    assert [row_text(n) for n in snapshot.nodes.values()][1:] == [
        row_text(snapshot.nodes[c]) for c in runtime.store.children(root.trace_id)
    ]
    assert snapshot.nodes[runtime.store.children(root.trace_id)[0]].last_tool == "list_dir"


def test_a_wide_explore_is_summed_up_past_the_shown_children(tmp_path: Path) -> None:
    runtime, model = inline_runtime(tmp_path, MAX_CHILDREN_SHOWN + 5)
    root = create_root(runtime, TaskSpec("survey", model))
    Runner(runtime).run(root.trace_id)
    text = screen(render(TreeState(runtime.store, root.trace_id)))
    assert sum("── explore-" in line for line in text.splitlines()) == MAX_CHILDREN_SHOWN
    assert "… 5 more (5 completed)" in text


def test_watching_a_branch_shows_only_its_subtree(tmp_path: Path) -> None:
    runtime, model = inline_runtime(tmp_path, 2)
    root = create_root(runtime, TaskSpec("survey", model))
    Runner(runtime).run(root.trace_id)
    branch = runtime.store.children(root.trace_id)[0]
    state = TreeState(runtime.store, branch)
    for _, event in runtime.store.read_events(root.trace_id):
        state.apply(event)
    assert list(state.nodes) == [branch]


# -- the command, on a real worker -------------------------------------------------


@pytest.fixture
def fleet(worker_fleet: Fleet) -> Fleet:
    return worker_fleet


def watch_env(url: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return {**clean, "FLEET_REDIS_URL": url}


@pytest.mark.integration
def test_watch_follows_a_live_tree_in_plain_lines(
    worker_url: str, fleet: Fleet, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "model.yaml", 3, latency_ms=50, branch_turns=2)
    root = create_root(fleet.runtime, TaskSpec("survey", model))
    watcher = subprocess.Popen(
        [*FLEET, "watch", root.trace_id, "--timeout-s", WATCH_S],
        env=watch_env(worker_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert watcher.stdout is not None
    first = watcher.stdout.readline()  # the snapshot: watching has begun
    assert first.startswith("main  queued  it 0"), first
    fleet.backend.enqueue(root)
    rest, stderr = watcher.communicate(timeout=CLI_TIMEOUT_S)
    assert watcher.returncode == 0, stderr
    lines = [first.rstrip("\n"), *rest.splitlines()]
    assert lines[-1] == f"{root.trace_id} completed"
    for child in fleet.store.children(root.trace_id):
        mine = [line for line in lines if line.endswith(child)]
        assert mine[0].startswith("  explore-") and mine[-1].startswith("  explore-")
        assert "  completed  it 3" in mine[-1] and "last list_dir" in mine[-1]
        assert any("running" in line for line in mine), "seen while it ran"
    assert any(line.startswith("main  waiting") for line in lines)


@pytest.mark.integration
def test_watch_on_a_terminal_draws_the_tree(worker_url: str, fleet: Fleet, tmp_path: Path) -> None:
    model = explore_script(tmp_path / "model.yaml", 2)
    handle = fleet.submit("survey", model=model)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*FLEET, "watch", handle.trace_id, "--timeout-s", WATCH_S],
        env={**watch_env(worker_url), "COLUMNS": "160", "TERM": "xterm"},
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    drawn = read_until_exit(controller, process, CLI_TIMEOUT_S)
    assert process.returncode == 0
    assert "├── " in drawn and "└── " in drawn and "explore-002" in drawn
    assert f"{handle.trace_id} completed" in drawn


@pytest.mark.integration
def test_watch_gives_up_after_its_timeout(worker_url: str, fleet: Fleet, tmp_path: Path) -> None:
    stuck = create_root(
        fleet.runtime, TaskSpec("never enqueued", explore_script(tmp_path / "m.yaml", 1))
    )
    result = subprocess.run(
        [*FLEET, "watch", stuck.trace_id, "--timeout-s", "0.5"],
        env=watch_env(worker_url),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert result.returncode == 1
    assert result.stdout.startswith("main  queued  it 0")
    error = result.stderr.strip()
    assert error == f"fleet: error: trace {stuck.trace_id!r} still running after 0.5 s"
