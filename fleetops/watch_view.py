"""`fleet watch ID`: the live tree of a trace, built from the tree's event stream.

Each node shows status, iteration, tokens and the last tool called. On a terminal it is a
rich tree redrawn in place; otherwise one line per change of a node, indented by depth.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fleet.control import subtree
from fleet.limits.capability import budget_state
from fleet.models import Event, Trace, task_images
from fleet.storage.store import TraceContent, TraceStore
from fleetops.cli.output import printable

if TYPE_CHECKING:
    from fleet.client import Fleet

MAX_CHILDREN_SHOWN = 20
"""Per parent in the live tree; the rest are summed up in one line."""
REFRESH_PER_S = 4
BUDGET_EVERY_S = 0.5
"""The tree's budget is re-read at most this often while events come in."""
BLOCK_MS = 1000
"""One blocking read of the event stream; the deadline is checked between reads."""
STATUS_STYLE = {
    "queued": "dim",
    "running": "yellow",
    "waiting": "cyan",
    "completed": "green",
    "failed": "red",
    "stopped": "magenta",
}
_ORDER = {"running": 0, "waiting": 1, "failed": 2, "stopped": 3, "queued": 4, "completed": 5}


@dataclass
class Node:
    """What the view shows of one trace."""

    trace_id: str
    parent_trace_id: str | None
    label: str
    status: str
    iteration: int = 0
    tokens: int = 0
    last_tool: str | None = None
    images: str = ""
    """The task's images as placeholders (`1 image(s): [image PNG 800x600, 12.3 KB]`)."""


def node_of(trace: Trace, last_tool: str | None = None) -> Node:
    """A node from the stored trace."""
    return Node(
        trace_id=trace.trace_id,
        parent_trace_id=trace.parent_trace_id,
        label=trace.name if trace.name and trace.parent_trace_id else trace.mode,
        status=trace.status,
        iteration=trace.iteration,
        tokens=trace.stats.prompt_tokens + trace.stats.completion_tokens,
        last_tool=last_tool,
        images=task_images(trace),
    )


def row_text(node: Node) -> str:
    """`researcher  running  it 3  1,204 tok  last read_file  ID`."""
    tool = f"  last {node.last_tool}" if node.last_tool else ""
    row = f"{node.label}  {node.status}  it {node.iteration}  {node.tokens:,} tok{tool}"
    row += f"  {node.images}" if node.images else ""
    return printable(f"{row}  {node.trace_id}")


class TreeState:
    """The subtree of one trace, kept current by `apply`; safe to read from another thread."""

    def __init__(self, store: TraceStore, trace_id: str) -> None:
        """Load the subtree as it is now."""
        self.store = store
        self.top = trace_id
        self.lock = threading.Lock()
        self.nodes: dict[str, Node] = {}
        self.children: dict[str, list[str]] = defaultdict(list)
        for tid in subtree(store, trace_id):
            self._add(store.get_trace(tid), _last_tool(store, tid))
        self.root = store.get_trace(trace_id).root_trace_id
        self.budget = ""
        """The tree's budget line (`budget: used/limit tokens ...`), or "" without one."""
        self._budget_read_s = 0.0
        self.read_budget()

    def read_budget(self, every_s: float = 0.0) -> None:
        """Re-read the tree's budget, at most once per `every_s`."""
        if time.monotonic() - self._budget_read_s < every_s:
            return
        self._budget_read_s = time.monotonic()
        state = budget_state(self.store, self.root)
        self.budget = state.line() if state else ""

    def _add(self, trace: Trace, last_tool: str | None) -> Node:
        node = node_of(trace, last_tool)
        if trace.trace_id not in self.nodes and trace.parent_trace_id in self.nodes:
            self.children[trace.parent_trace_id].append(trace.trace_id)
        self.nodes[trace.trace_id] = node
        return node

    def apply(self, event: Event) -> Node | None:
        """Refresh the node the event is about; None if it is outside this subtree.

        Status and last tool come from the event, so a watcher that lags still shows each
        step (a parent's short `waiting`, say); iteration and tokens are read from the store.
        """
        known = self.nodes.get(event.trace_id)
        trace = self.store.get_trace(event.trace_id)
        if known is None and trace.parent_trace_id not in self.nodes:
            return None
        last_tool = known.last_tool if known else None
        tools = event.data.get("tools") if event.kind == "message" else None
        if tools:
            last_tool = ", ".join(str(t) for t in tools)
        if event.kind in ("trace", "finish") and event.status:
            trace = trace.model_copy(update={"status": event.status})
        if event.kind in ("message", "finish"):
            self.read_budget(every_s=BUDGET_EVERY_S)
        with self.lock:
            return self._add(trace, last_tool)

    def refresh(self) -> None:
        """Re-read every node (at the end: events may have been cut short)."""
        for trace_id, node in list(self.nodes.items()):
            trace = self.store.get_trace(trace_id)
            with self.lock:
                self._add(trace, node.last_tool)
        self.read_budget()

    def depth(self, trace_id: str) -> int:
        """0 for the watched trace, 1 for its children, ..."""
        depth, node = 0, self.nodes[trace_id]
        while node.trace_id != self.top and node.parent_trace_id in self.nodes:
            depth += 1
            node = self.nodes[node.parent_trace_id]
        return depth


def _last_tool(store: TraceContent, trace_id: str) -> str | None:
    for message in reversed(store.messages(trace_id)):
        if message.role == "assistant" and message.tool_calls:
            return ", ".join(str(c.get("function", {}).get("name")) for c in message.tool_calls)
    return None


def render(state: TreeState) -> Any:
    """The rich Tree of the state (children beyond MAX_CHILDREN_SHOWN summed up)."""
    from rich.text import Text
    from rich.tree import Tree

    with state.lock:
        tree = Tree(_label(state.nodes[state.top]))
        if state.budget:
            tree.add(Text(printable(state.budget), style="yellow"))
        _grow(state, state.top, tree)
    return tree


def _grow(state: TreeState, trace_id: str, branch: Any) -> None:
    kids = [state.nodes[k] for k in state.children.get(trace_id, [])]
    shown = sorted(kids, key=lambda n: _ORDER.get(n.status, 9))[:MAX_CHILDREN_SHOWN]
    keep = {n.trace_id for n in shown}
    for node in kids:  # creation order among the shown ones
        if node.trace_id in keep:
            _grow(state, node.trace_id, branch.add(_label(node, short_id=True)))
    hidden = Counter(n.status for n in kids if n.trace_id not in keep)
    if hidden:
        summary = ", ".join(f"{count} {status}" for status, count in sorted(hidden.items()))
        branch.add(f"[dim]… {sum(hidden.values())} more ({summary})[/]")


def _label(node: Node, short_id: bool = False) -> Any:
    from rich.text import Text

    shown_id = "@" + node.trace_id.rsplit("@", 1)[-1] if short_id else node.trace_id
    text = Text()
    text.append(printable(node.label), style="bold")
    text.append(f"  {node.status}", style=STATUS_STYLE.get(node.status, ""))
    text.append(f"  it {node.iteration}  {node.tokens:,} tok")
    if node.last_tool:
        text.append(f"  last {printable(node.last_tool)}", style="italic")
    if node.images:
        text.append(f"  {node.images}", style="cyan")
    text.append(f"  {shown_id}", style="dim")
    return text


class LiveTree:
    """The tree redrawn in place on a terminal."""

    def __init__(self, state: TreeState) -> None:
        """Draw `state` until the context exits."""
        from rich.live import Live

        self.live = Live(get_renderable=lambda: render(state), refresh_per_second=REFRESH_PER_S)

    def __enter__(self) -> LiveTree:
        self.live.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.stop()

    def changed(self, node: Node, depth: int) -> None:
        """Nothing to do: the live display redraws on its own."""


class PlainTree:
    """One line per change of a node, indented by its depth."""

    def __init__(self, state: TreeState) -> None:
        """Print the nodes of `state` as they are, then their changes."""
        self.state = state
        self.said: dict[str, str] = {}

    def __enter__(self) -> PlainTree:
        for trace_id in list(self.state.nodes):
            self.changed(self.state.nodes[trace_id], self.state.depth(trace_id))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def changed(self, node: Node, depth: int) -> None:
        """Print the node's row (and the tree's budget) if it differs from the last printed."""
        row = row_text(node)
        if self.said.get(node.trace_id) != row:
            self.said[node.trace_id] = row
            print("  " * depth + row, flush=True)
        if self.state.budget and self.said.get("") != self.state.budget:
            self.said[""] = self.state.budget
            print(printable(self.state.budget), flush=True)


def watch_trace(fleet: Fleet, trace_id: str, timeout_s: float | None, *, live: bool) -> Trace:
    """Show the tree under `trace_id` until it finishes; the final trace.

    Raises:
        TimeoutError: still running after `timeout_s`.
    """
    store = fleet.store
    root = store.get_trace(trace_id).root_trace_id
    cursor = stream_end(store, root)  # before the snapshot: later events are all news
    state = TreeState(store, trace_id)
    view: LiveTree | PlainTree = LiveTree(state) if live else PlainTree(state)
    with view:
        for event in follow(store, trace_id, root, cursor, timeout_s):
            node = state.apply(event)
            if node is not None:
                view.changed(node, state.depth(node.trace_id))
        state.refresh()
        for tid in list(state.nodes):
            view.changed(state.nodes[tid], state.depth(tid))
    return store.get_trace(trace_id)


def stream_end(store: TraceContent, root_trace_id: str) -> str:
    """The id of the last event in the tree's stream ("0" if none)."""
    cursor = "0"
    while batch := store.read_events(root_trace_id, cursor):
        cursor = batch[-1][0]
    return cursor


def follow(
    store: TraceStore, trace_id: str, root_trace_id: str, cursor: str, timeout_s: float | None
) -> Iterator[Event]:
    """Events of the tree after `cursor` until `trace_id` is terminal."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not store.get_trace(trace_id).is_terminal:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"trace {trace_id!r} still running after {timeout_s} s")
        for entry_id, event in store.read_events(root_trace_id, cursor, block_ms=BLOCK_MS):
            cursor = entry_id
            yield event
