"""`fleet archive`: finished trees to a JSONL file, and back for `fleet trace show`.

The file holds, per tree, one line per trace (`{"kind": "trace", "fields": {...},
"collaborators": [[child, entry], ...]}`: the trace hash's fields as Redis stores them,
messages included) and then one line of the tree's events (`{"kind": "events", "root":
ROOT, "events": [[id, event], ...]}`). Only trees whose every trace ended are exported.

Export writes a temporary file beside the target and renames it once complete (an export
cut short leaves no file), and refuses to replace an existing one; `--drop` deletes the
trees from Redis only after that. It leaves out the fleet's run state
(`fleetops.archive_checks.strip_reserved`). Import reads and checks the whole file before
it writes anything, and refuses trees that would graft onto or steer the fleet's own (ids
Redis holds, parents outside the tree, unfinished traces, the fleet's reserved fields:
`fleetops.archive_checks`); a refusal is one error naming the file and line. Then it
writes each tree back compacted with the retention TTL.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from fleet.errors import ConfigError, TraceNotFound
from fleet.owners import tree_ended
from fleet.storage.backends.redis.archive import (
    ARCHIVE,
    BadRecord,
    TraceRecord,
    TreeArchive,
    TreeRecord,
    check_trace,
    check_tree,
)
from fleet.storage.store import Services, TraceRecords, TraceStore
from fleetops.archive_checks import (
    refusal_of_events,
    refusal_of_ids,
    refusal_of_live,
    refusal_of_record,
    refusal_of_tree,
    strip_reserved,
)

MAX_LINE_BYTES = 256 * 1024 * 1024
"""A line longer than this is refused (a tree of 10,000 branches is far smaller)."""


@dataclass(frozen=True)
class Done:
    """What a run of `fleet archive` did."""

    trees: int
    traces: int

    def line(self, verb: str, path: Path) -> str:
        """One line for the terminal."""
        return f"{verb} {self.trees} trees ({self.traces} traces) {path}"


def export(store: TraceStore, path: Path, roots: Sequence[str] = (), *, drop: bool = False) -> Done:
    """The finished trees (`roots`, else every finished root) into a new JSONL file."""
    if path.exists():
        raise ConfigError(f"{str(path)!r} exists: archive into a new file")
    written: list[TreeRecord] = []  # their ids only, for --drop (one tree in memory at once)
    temp = path.with_name(f".{path.name}.partial")
    try:
        with temp.open("w", encoding="utf-8") as out:
            for tree in _finished(store, roots):
                out.writelines(line + "\n" for line in tree.lines())
                written.append(_ids_only(tree))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException as exc:
        temp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
        raise
    if drop:
        archive = store.capability(ARCHIVE)
        for tree in written:
            archive.drop_tree(tree)
    return Done(len(written), sum(len(tree.traces) for tree in written))


def _ids_only(tree: TreeRecord) -> TreeRecord:
    """The tree with only what `drop_tree` reads (its traces' ids), not their messages."""
    traces = [TraceRecord({"trace_id": t.fields["trace_id"]}) for t in tree.traces]
    return TreeRecord(tree.root_trace_id, traces, [])


def _finished(store: TraceStore, roots: Sequence[str]) -> Iterator[TreeRecord]:
    archive = store.capability(ARCHIVE)
    for root in roots or _all_roots(store, archive):
        if not tree_ended(store, root):
            if roots:
                raise ConfigError(f"tree {root!r} has not ended: archive it once it has")
            continue
        tree = archive.read_tree(root)
        if tree is None:
            if roots:
                raise TraceNotFound(f"no trace {root!r}")
            continue
        yield TreeRecord(root, [strip_reserved(t) for t in tree.traces], tree.events)


def _all_roots(store: TraceRecords, archive: TreeArchive, page: int = 1_000) -> Iterator[str]:
    """Every root in the traces index, newest first, read a page at a time."""
    start = 0
    while ids := archive.newest_ids(start, page):
        start += len(ids)
        for candidate in (i for i in ids if "@" not in i):  # a child's id has an @
            try:
                if store.get_trace(candidate).parent_trace_id is None:
                    yield candidate
            except TraceNotFound:
                continue  # expired; the index has no TTL of its own


class _TraceLine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    kind: str
    fields: dict[str, str]
    collaborators: list[tuple[str, str]]


class _EventsLine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    kind: str
    root: str
    events: list[tuple[str, str]]


class _Refused(BadRecord):
    """A rule of `fleetops.archive_checks` broken by the trace read at `record.line`."""

    def __init__(self, record: TraceRecord, why: str) -> None:
        super().__init__(why)
        self.line = record.line


def read_file(path: Path) -> list[TreeRecord]:
    """Every tree of an archive file, checked; `ConfigError` naming the file and line."""
    trees: list[TreeRecord] = []
    pending: list[TraceRecord] = []
    try:
        with path.open("rb") as lines:
            for number, raw in enumerate(lines, 1):
                try:
                    pending = _read_line(raw, number, pending, trees)
                except (BadRecord, ValidationError, ValueError) as exc:
                    line = exc.line if isinstance(exc, _Refused) else number
                    raise ConfigError(f"{path}:{line}: {_problem(exc)}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    if pending:
        raise ConfigError(f"{path}: ends inside a tree (no events line after its traces)")
    if twice := refusal_of_ids(trees):
        raise ConfigError(f"{path}:{twice[0].line}: {twice[1]}")
    return trees


def _problem(exc: Exception) -> str:
    """The first thing wrong, on one line (a validation error's first field and message)."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])[:80]
        return f"{where}: {first['msg']}"[:200]
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _read_line(
    raw: bytes, number: int, pending: list[TraceRecord], trees: list[TreeRecord]
) -> list[TraceRecord]:
    """Add one line: a trace to `pending`, or an events line closing a tree into `trees`."""
    if len(raw) > MAX_LINE_BYTES:
        raise ValueError("line too long")
    item: Any = json.loads(raw)
    kind = item.get("kind") if isinstance(item, dict) else None
    if kind == "trace":
        line = _TraceLine.model_validate_json(raw)
        record = TraceRecord(line.fields, list(line.collaborators), number)
        trace = check_trace(record)  # here, so that the error names this line
        if why := refusal_of_record(record, trace):
            raise BadRecord(why)
        return [*pending, record]
    if kind == "events":
        events = _EventsLine.model_validate_json(raw)
        tree = TreeRecord(events.root, pending, list(events.events))
        check_tree(tree)
        if graft := refusal_of_tree(tree):
            raise _Refused(*graft)
        if why := refusal_of_events(tree):
            raise BadRecord(why)
        trees.append(tree)
        return []
    raise ValueError(f"unknown line kind {str(kind)[:40]!r}")


def import_file(store: Services, path: Path, retention_s: int) -> Done:
    """Every tree of the file back in Redis (checked whole first), compacted."""
    trees = read_file(path)
    archive = store.capability(ARCHIVE)
    for tree in trees:  # every tree before the first write: a refusal writes nothing
        if live := refusal_of_live(archive, tree):
            raise ConfigError(f"{path}:{live[0].line}: {live[1]}")
    written = sum(archive.write_tree(tree, retention_s) for tree in trees)
    return Done(len(trees), written)
