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
from typing import Any

from fleet.budget import budget_state
from fleet.models import Trace
from fleet.store import TraceStore

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
        "error": trace.error,
        "collaborators": [
            {"name": c.name, "trace_id": c.trace_id, "status": c.status, "summary": c.summary}
            for c in store.collaborators(trace.trace_id)
        ],
        "stats": trace.stats.model_dump(),
        "stop_reason": trace.metadata.get("stop_reason"),
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
        "task": trace.task,
        "answer": trace.answer,
        "error": trace.error,
        "iteration": trace.iteration,
        "stats": trace.stats.model_dump(),
        "stop_reason": trace.metadata.get("stop_reason"),
        "budget": _budget_json(store, trace),
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
        "created_at_ms": trace.created_at_ms,
    }


def render_tree(store: TraceStore, trace: Trace, indent: str = "") -> list[str]:
    """A readable tree: one line per trace, its answer or error beneath."""
    stats = trace.stats
    line = (
        f"{indent}{trace.trace_id}  [{trace.mode}, {trace.status}]  "
        f"{stats.messages} msgs, {stats.prompt_tokens + stats.completion_tokens} tokens"
    )
    lines = [line, f"{indent}  task: {_one_line(trace.task)}"]
    if reason := trace.metadata.get("stop_reason"):
        lines[0] += f"  (stop_reason: {reason})"
    if not trace.parent_trace_id and (state := budget_state(store, trace.trace_id)):
        lines.append(f"{indent}  {state.line()}")
    if trace.answer:
        lines.append(f"{indent}  answer: {_one_line(trace.answer)}")
    if trace.error:
        lines.append(f"{indent}  error: {_one_line(trace.error)}")
    for child in store.children(trace.trace_id):
        lines += render_tree(store, store.get_trace(child), indent + "  ")
    return lines


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(printable(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def report(store: TraceStore, trace: Trace, *, as_json: bool) -> int:
    """Print a finished run (the answer, or the JSON object); exit 0 only if it completed."""
    if as_json:
        print(dumps(result_object(store, trace)))
    elif trace.status == "completed":
        print(printable(trace.answer or ""))
    else:
        print(printable(f"{trace.status}: {trace.error}"), file=sys.stderr)
    return 0 if trace.status == "completed" else 1


def print_json(value: object) -> None:
    """Machine-readable output on stdout, control characters escaped."""
    print(dumps(value))
