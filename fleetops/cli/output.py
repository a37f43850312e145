"""How results are printed: the `--json` object and the human tree.

Model text is untrusted, and a terminal obeys what it prints: an OSC 52 sequence writes
the clipboard, OSC 0 the window title, CSI sequences move the cursor and repaint what was
already shown. `printable` strips every escape sequence and control character from text
before it is printed for a person; `dumps` escapes them (C1 and bidi controls too, which
`json.dumps(ensure_ascii=False)` leaves raw) for `--json`.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

from fleet.conversation.continuation import branches, turn_of
from fleet.conversation.human import waiting_on
from fleet.limits.capability import budget_state
from fleet.models import Trace, task_images
from fleet.storage.store import TraceContent, TraceStore
from fleetops.cli.exit_codes import ExitCode

_ESCAPE = re.compile(
    r"\x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC ... BEL/ST (title, clipboard, links)
    r"|\x1b[P^_X][^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS/PM/APC/SOS ... ST
    r"|\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: colours, cursor moves, erase
    r"|\x9b[0-?]*[ -/]*[@-~]?|\x9d[^\x07\x9c]*(?:\x07|\x9c)?"  # the 8-bit CSI and OSC
    r"|\x1b[ -/]*[0-~]?"  # any other escape
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 (but tab and newline), DEL, C1, and the bidi overrides that reorder what is shown."""
_JSON_UNSAFE = re.compile(r"[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without escape sequences or control characters (tab and newline stay)."""
    return _CONTROL.sub("", _ESCAPE.sub("", text))


def dumps(value: object) -> str:
    """Indented JSON, non-ASCII kept readable, every control character escaped."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def result_object(store: TraceStore, trace: Trace) -> dict[str, Any]:
    """The object `fleet run --json` prints, inline or through the fleet."""
    return {
        "trace_id": trace.trace_id,
        "status": trace.status,
        "answer": trace.answer,
        "output": trace.output,
        "error": trace.error,
        "question": (waiting_on(trace) or {}).get("question"),
        "collaborators": [
            {"name": c.name, "trace_id": c.trace_id, "status": c.status, "summary": c.summary}
            for c in store.collaborators(trace.trace_id)
        ],
        "stats": trace.stats.model_dump(),
        "stop_reason": trace.run.stop_reason,
        "budget": _budget_json(store, trace),
    }


def _budget_json(store: TraceStore, trace: Trace) -> dict[str, Any] | None:
    """A root's budget (limit, used, reserved); None for a child or a tree without one."""
    if trace.parent_trace_id:
        return None
    state = budget_state(store, trace.trace_id)
    return state.to_json() if state else None


def trace_object(store: TraceStore, trace: Trace) -> dict[str, Any]:
    """`fleet trace show --json`: the trace, its collaborators and its children, recursively."""
    return {
        "trace_id": trace.trace_id,
        "parent_trace_id": trace.parent_trace_id,
        "root_trace_id": trace.root_trace_id,
        "mode": trace.mode,
        "status": trace.status,
        "preset": trace.preset,
        "model": trace.model,
        "memory": trace.memory,
        "task": trace.task,
        "answer": trace.answer,
        "output": trace.output,
        "error": trace.error,
        "waiting_on": waiting_on(trace),
        "iteration": trace.iteration,
        "stats": trace.stats.model_dump(),
        "stop_reason": trace.run.stop_reason,
        "budget": _budget_json(store, trace),
        "goals": trace.goals.model_dump(mode="json")["goals"],
        "branches": _branches(store, trace),
        "collaborators": [c.model_dump(mode="json") for c in store.collaborators(trace.trace_id)],
        "children": [
            trace_object(store, store.get_trace(child)) for child in store.children(trace.trace_id)
        ],
    }


def list_object(trace: Trace) -> dict[str, Any]:
    """One row of `fleet trace list --json`."""
    return {
        "trace_id": trace.trace_id,
        "parent_trace_id": trace.parent_trace_id,
        "status": trace.status,
        "mode": trace.mode,
        "task": trace.task,
        "question": (waiting_on(trace) or {}).get("question"),
        # A call waiting for approval: as shown to a person, and the digest to answer it.
        "shown": (waiting_on(trace) or {}).get("shown"),
        "digest": (waiting_on(trace) or {}).get("digest"),
        "created_at_ms": trace.created_at_ms,
    }


def _given(trace: Trace, indent: str) -> list[str]:
    """What the task came with: its images, the tree's memory namespaces."""
    lines = []
    if images := task_images(trace):  # placeholders: a trace holds references, never bytes
        lines.append(f"{indent}  with {images}")
    if trace.memory and not trace.parent_trace_id:  # children inherit it: said once
        lines.append(f"{indent}  memory: {', '.join(trace.memory)}")
    return lines


def render_tree(store: TraceStore, trace: Trace, indent: str = "") -> list[str]:
    """A readable tree: one line per trace, its answer or error beneath."""
    stats = trace.stats
    line = (
        f"{indent}{trace.trace_id}  [{trace.mode}, {trace.status}]  "
        f"{stats.messages} msgs, {stats.prompt_tokens + stats.completion_tokens} tokens"
    )
    if stats.cached_tokens:  # part of the tokens above, read from the provider's cache
        line += f" ({stats.cached_tokens} cached)"
    lines = [line, f"{indent}  {timing(trace)}", f"{indent}  task: {_one_line(trace.task)}"]
    lines += _given(trace, indent)
    if reason := trace.run.stop_reason:
        lines[0] += f"  (stop_reason: {reason})"
    if not trace.parent_trace_id and (state := budget_state(store, trace.trace_id)):
        lines.append(f"{indent}  {state.line()}")
    if trace.answer:
        lines.append(f"{indent}  answer: {_one_line(trace.answer)}")
    if trace.output is not None:
        lines.append(f"{indent}  output: {_one_line(json.dumps(trace.output))}")
    if trace.error:
        lines.append(f"{indent}  error: {_one_line(trace.error)}")
    for moved in trace.run.model_fallbacks:
        lines.append(f"{indent}  model: {moved.to} (after {moved.from_model}: {moved.error})")
    lines += _detail_lines(store, trace, indent + "  ")
    for child in store.children(trace.trace_id):
        lines += render_tree(store, store.get_trace(child), indent + "  ")
    return lines


def timing(trace: Trace, now_ms: int | None = None) -> str:
    """`started 2026-11-28 22:27:09 UTC, took 12.3 s` (or `running for` while it runs)."""
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(trace.created_at_ms / 1000))
    if trace.finished_at_ms is not None:
        return f"started {started}, took {duration(trace.finished_at_ms - trace.created_at_ms)}"
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"started {started}, {trace.status} for {duration(now_ms - trace.created_at_ms)}"


def duration(ms: int) -> str:
    """`850 ms`, `12.3 s`, `4 min 05 s`, `2 h 03 min`."""
    if ms < 1000:
        return f"{max(ms, 0)} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(ms // 1000, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def goal_status(status: str, trace: Trace) -> str:
    """A goal's status as the tree's end left it: a finished trace has no goal in progress.

    The plan is the model's; a trace that ended without marking a goal keeps the mark it
    had, which read as if work were still going on. On a finished trace an open goal shows
    what became of it: `done` when the trace completed, `abandoned` otherwise.
    """
    if not trace.is_terminal or status not in ("pending", "in_progress"):
        return status
    return "done" if trace.status == "completed" and status == "in_progress" else "abandoned"


def _branches(store: TraceContent, trace: Trace) -> list[dict[str, Any]]:
    """The message tree's branches of a root (sub-traces: none, to keep `show` cheap)."""
    if trace.parent_trace_id is not None:
        return []
    return branches(store.messages(trace.trace_id), trace.head_sequence)


def _detail_lines(store: TraceStore, trace: Trace, indent: str) -> list[str]:
    """Goals with their sub-traces, a person's question, and branches of a continued root."""
    lines = []
    for goal in trace.goals.goals:
        subs = f"  sub-traces: {', '.join(goal.sub_trace_ids)}" if goal.sub_trace_ids else ""
        status = goal_status(goal.status, trace)
        lines.append(f"{indent}goal {goal.id} [{status}] {_one_line(goal.description)}{subs}")
    for entry in store.collaborators(trace.trace_id):
        if entry.type == "human":
            lines.append(f"{indent}human [{entry.status}]: {_one_line(entry.summary)}")
        if entry.type == "remote":  # a remote child's A2A task (fleet.remote)
            remote = printable(entry.trace_id)
            lines.append(f"{indent}remote {remote} [{entry.status}]: {_one_line(entry.summary)}")
    found = _branches(store, trace)
    if len(found) > 1 or turn_of(trace) > 0:
        lines.append(f"{indent}conversation: {len(found)} branch(es)")
        for branch in found:
            mark = "*" if branch["main"] else "-"
            turns = ", ".join(
                f"#{t['sequence']} {_one_line(t['content'], 40)!r}" for t in branch["user_turns"]
            )
            lines.append(f"{indent}{mark} to #{branch['leaf_sequence']}: {turns}")
    return lines


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(printable(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


"""`fleet run` ended while the trace waits on a person (`fleet reply` resumes it)."""


def report(store: TraceStore, trace: Trace, *, as_json: bool) -> int:
    """Print a run (the answer, or the JSON object); exit 0 only if it completed."""
    waiting = waiting_on(trace) is not None
    if as_json:
        print(dumps(result_object(store, trace)))
    elif trace.status == "completed":
        print(printable(trace.answer or ""))
    elif not waiting:
        print(printable(f"{trace.status}: {trace.error}"), file=sys.stderr)
    if waiting:
        return ExitCode.WAITING
    return ExitCode.OK if trace.status == "completed" else ExitCode.FAILED


def print_json(value: object) -> None:
    """Machine-readable output on stdout, control characters escaped."""
    print(dumps(value))


def approval_lines(trace_id: str, waiting: dict[str, Any]) -> str:
    """The whole call a trace waits to have approved, and how to approve exactly it.

    `shown` is already neutralised where it was made (`fleet.conversation.shown_call`);
    `printable` strips anything else, since it comes from Redis.
    """
    call = str(waiting.get("shown") or waiting.get("tool") or "")
    digest = str(waiting.get("digest") or "")
    how = f"fleet approve {trace_id} --digest {digest}" if digest else f"fleet approve {trace_id}"
    lines = [*call.splitlines(), f"digest: {digest}", f"approve with `{how}`"]
    return "\n".join("    " + printable(line) for line in lines)
