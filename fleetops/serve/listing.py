"""`GET /api/traces`: the filtered, cursor-paged list the front page works with (no HTTP here).

The store keeps an index of traces, newest first; filters are applied to the newest
`SCAN_TRACES` of them (a list of a fleet's recent work, not a search engine). `roots` reads
the index of roots instead (`fleet.storage.root_index`: a page of trees from any cursor,
whatever the branches), `waiting` the index of waits on a person (every one). A page ends
with a cursor naming its last row; the next page starts strictly after that row, so traces
created meanwhile never shift it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from fleet import ids
from fleet.control import existing, subtree
from fleet.conversation.human import indexed_waits
from fleet.errors import FleetError, InvalidTraceId
from fleet.models import Status, Trace
from fleet.storage.root_index import ROOTS
from fleet.storage.store import TraceContent, TraceRecords, TraceStore

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
SCAN_TRACES = 2000
"""How many traces a filtered list reads at most: the newest, or for `roots` the roots from
the cursor on (their index); `waiting` reads its own index whole."""
ROOTS_PAGE = 200
"""Roots read from their index per round trip."""
STATUSES: tuple[str, ...] = get_args(Status)
WAITING_ON = ("person", "approval", "any")
CURSOR = re.compile(r"^([0-9]{1,16})~([A-Za-z0-9@._:-]{1,300})$")
MAX_TEXT_CHARS = 200
ARGUMENTS = frozenset(
    {"status", "root", "waiting", "model", "preset", "q", "roots", "cursor", "limit"}
)


class BadRequest(FleetError):
    """A request the API cannot answer as asked: the message says what and where."""


def check_trace_id(trace_id: str) -> str:
    """The id if it can be a trace id (`fleet.ids`), else `BadRequest`: nothing is read."""
    try:
        return ids.check_trace_id(trace_id)
    except InvalidTraceId as exc:
        raise BadRequest(str(exc)) from None


@dataclass(frozen=True)
class TraceFilter:
    """The `GET /api/traces` query: every field optional."""

    status: str | None = None
    root: str | None = None
    """A root trace id: that tree only, parents first (no paging)."""
    waiting: str | None = None
    """`person`, `approval` or `any`: only traces waiting on a person (`waiting=1` = any)."""
    model: str | None = None
    preset: str | None = None
    text: str | None = None
    """`q=`: a case-insensitive part of the id, name, task or answer."""
    roots: bool = False
    """Only root traces, each with its tree's totals (`branches`, `tree_stats`)."""
    cursor: tuple[int, str] | None = None
    """(created_at_ms, trace_id) of the last row of the page before."""
    limit: int = DEFAULT_LIMIT

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> TraceFilter:
        """From query arguments; `BadRequest` names the bad one."""
        unknown = sorted(set(query) - ARGUMENTS)
        if unknown:
            raise BadRequest(f"unknown query argument(s) {unknown!r}")
        status = query.get("status") or None
        if status is not None and status not in STATUSES:
            raise BadRequest(f"status {status[:40]!r} is not one of {', '.join(STATUSES)}")
        root = query.get("root") or None
        limit_text = query.get("limit", str(DEFAULT_LIMIT))
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
            raise BadRequest(f"limit {limit_text[:20]!r} must be an integer 1..{MAX_LIMIT}")
        return cls(
            status=status,
            root=check_trace_id(root) if root else None,
            waiting=_waiting(query.get("waiting", "")),
            model=_text(query, "model"),
            preset=_text(query, "preset"),
            text=_text(query, "q"),
            roots=_flag(query, "roots"),
            cursor=_cursor(query.get("cursor", "")),
            limit=int(limit_text),
        )


def _waiting(raw: str) -> str | None:
    value = raw.lower()
    if value in ("", "0", "false"):
        return None
    if value in ("1", "true"):
        return "any"
    if value not in WAITING_ON:
        raise BadRequest(f"waiting {raw[:20]!r} must be person, approval, any, 1 or 0")
    return value


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "").lower()
    if value not in ("", "0", "1", "true", "false"):
        raise BadRequest(f"{name} {value[:20]!r} must be 1/true or 0/false")
    return value in ("1", "true")


def _text(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name, "").strip()
    if len(value) > MAX_TEXT_CHARS:
        raise BadRequest(f"{name} is longer than {MAX_TEXT_CHARS} characters")
    return value or None


def _cursor(raw: str) -> tuple[int, str] | None:
    if not raw:
        return None
    match = CURSOR.match(raw)
    if match is None:
        raise BadRequest(f"cursor {raw[:40]!r} is not one this API gave (MS~TRACE_ID)")
    return int(match.group(1)), match.group(2)


def list_traces(store: TraceStore, query: TraceFilter) -> dict[str, Any]:
    """`{traces, next}`: newest first (a tree: parents first), filtered, at most `limit`."""
    if query.root is not None:
        traces = store.get_traces(subtree(store, query.root))
    elif query.waiting is not None:  # the index of waits: each one, however many are newer
        traces = indexed_waits(store)
    elif query.roots:  # the index of roots: trees however many branches are newer
        traces = indexed_roots(store, query)
    else:
        unfiltered = query == TraceFilter(limit=query.limit)
        traces = store.list_traces(limit=query.limit + 1 if unfiltered else SCAN_TRACES)
    if query.cursor is not None:
        traces = [t for t in traces if (t.created_at_ms, t.trace_id) < query.cursor]
    kept: list[tuple[Trace, str | None]] = []
    for trace in traces:
        if len(kept) > query.limit:
            break
        if matches(trace, query):
            on = waiting_on(store, trace)
            if query.waiting is None or (on is not None and query.waiting in (on, "any")):
                kept.append((trace, on))
    page, more = kept[: query.limit], len(kept) > query.limit and query.root is None
    rows = [row(store, trace, on, totals=query.roots) for trace, on in page]
    last = page[-1][0] if page and more else None
    return {"traces": rows, "next": f"{last.created_at_ms}~{last.trace_id}" if last else None}


def indexed_roots(store: TraceStore, query: TraceFilter) -> list[Trace]:
    """Roots from the roots index, newest first from the cursor on, until a page is full.

    At most SCAN_TRACES roots are read for one page (filters that match few of them).
    """
    index = store.capability(ROOTS)
    found: list[Trace] = []
    cursor, read = query.cursor, 0
    while read < SCAN_TRACES:
        entries = index.page(min(ROOTS_PAGE, SCAN_TRACES - read), cursor)
        if not entries:
            break
        read, cursor = read + len(entries), entries[-1]
        traces = existing(store, [root for _, root in entries])
        index.drop(sorted({r for _, r in entries} - {t.trace_id for t in traces}))
        found += traces
        if sum(matches(t, query) for t in found) > query.limit:
            break
    return found


def matches(trace: Trace, query: TraceFilter) -> bool:
    """Whether the trace passes every filter but `waiting` (that one reads the store)."""
    if query.roots and trace.parent_trace_id is not None:
        return False
    if query.status is not None and trace.status != query.status:
        return False
    if query.waiting is not None and trace.status != "waiting":
        return False
    if query.model is not None and trace.model != query.model:
        return False
    if query.preset is not None and trace.preset != query.preset:
        return False
    if query.text is None:
        return True
    needle = query.text.casefold()
    fields = (trace.trace_id, trace.name, trace.task, trace.answer or "")
    return any(needle in field.casefold() for field in fields)


def waiting_on(store: TraceContent, trace: Trace) -> str | None:
    """`person` or `approval` when a waiting trace waits on one, else None (its sub-agents)."""
    if trace.status != "waiting":
        return None
    for entry in store.collaborators(trace.trace_id):
        if entry.status == "waiting" and entry.type in ("human", "approval"):
            return "person" if entry.type == "human" else "approval"
    return None


def row(store: TraceRecords, trace: Trace, on: str | None, *, totals: bool) -> dict[str, Any]:
    """A trace's summary; `waiting_on`; with `totals`, its tree's branches, tokens and cost."""
    out = summary(trace) | {"waiting_on": on}
    if totals:
        tree = store.get_traces(subtree(store, trace.trace_id))
        out["branches"] = len(tree) - 1
        out["failed_branches"] = sum(
            t.status == "failed" for t in tree if t.trace_id != trace.trace_id
        )
        out["tree_stats"] = {
            "prompt_tokens": sum(t.stats.prompt_tokens for t in tree),
            "completion_tokens": sum(t.stats.completion_tokens for t in tree),
            "cost_usd": round(sum(t.stats.cost_usd for t in tree), 6),
        }
    return out


def summary(trace: Trace) -> dict[str, Any]:
    """What a list shows of a trace: no task text beyond a line, no messages."""
    return {
        "trace_id": trace.trace_id,
        "root_trace_id": trace.root_trace_id,
        "parent_trace_id": trace.parent_trace_id,
        "name": trace.name,
        "mode": trace.mode,
        "status": trace.status,
        "task": trace.task[:200],
        "model": trace.model,
        "preset": trace.preset,
        "iteration": trace.iteration,
        "stats": trace.stats.model_dump(mode="json"),
        "stop_reason": trace.run.stop_reason,
        "error": first_line(trace.error),
        "created_at_ms": trace.created_at_ms,
        "updated_at_ms": trace.updated_at_ms,
        "finished_at_ms": trace.finished_at_ms,
    }


ERROR_CHARS = 200


def first_line(error: str | None) -> str | None:
    """A trace's error as a list shows it: its first line, at most ERROR_CHARS."""
    if not error:
        return None
    line = error.strip().splitlines()[0] if error.strip() else ""
    return line[:ERROR_CHARS] or None
