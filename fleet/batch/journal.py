"""The results file of a batch (`--out`) and its sidecar, so a batch can resume.

`FILE` gets one JSON line per finished task. `FILE.submitted` gets, per task, a line before
its root is created (`intent_at_ms`) and one once it exists (`trace_id`), ahead of the
enqueue. Every line is flushed and fsynced, so a batch killed at any instant resumes
without running a task twice: finished ids are skipped, submitted ones are followed on
their existing root, and a root created just before the kill (an intent without a trace
id) is found in the store by its `batch`/`batch_entry` metadata.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import IO, Any

from fleet.batch.file import BatchInputError
from fleet.batch.values import (
    BATCH_KEY,
    BatchEntry,
    BatchHooks,
    BatchResult,
    ResumeState,
)
from fleet.errors import ConfigError
from fleet.models import now_ms
from fleet.storage.store import TraceRecords, TraceStore

SUBMITTED_SUFFIX = ".submitted"
ORPHAN_SCAN_START = 200
"""Newest traces read first when looking for a root created just before a kill."""
ORPHAN_SLACK_MS = 60_000
"""How far before its intent an orphan's creation time may lie (clock steps, slow writes)."""


def sidecar_path(path: Path) -> Path:
    """`results.jsonl` -> `results.jsonl.submitted`."""
    return path.with_name(path.name + SUBMITTED_SUFFIX)


class ResultsJournal(BatchHooks):
    """Appends to the results file and its sidecar; reads both back on `--resume`."""

    def __init__(self, path: Path, batch_key: str) -> None:
        """Use `open`; this only sets up empty state."""
        self.path = path
        self.batch_key = batch_key
        self.previous: dict[str, dict[str, Any]] = {}
        """Results of earlier runs, by id."""
        self.submitted_ids: dict[str, str] = {}
        self.intents: dict[str, int] = {}
        self._out: IO[str] | None = None
        self._side: IO[str] | None = None

    @classmethod
    def open(cls, path: Path, *, resume: bool) -> ResultsJournal:
        """Start a results file, or with `resume` continue the one an earlier run left.

        Raises:
            ConfigError: results exist and `resume` is off, or a file is not a journal.
        """
        side = sidecar_path(path)
        if not resume:
            if _has_content(path) or _line_count(side) > 1:  # more than a header
                raise ConfigError(
                    f"{path} already holds results: pass --resume to continue that batch,"
                    " or choose another --out"
                )
            for fresh in (path, side):
                _truncate(fresh)
        header = _read_lines(side)[:1] if resume else []
        key = str(header[0][1].get(BATCH_KEY) or "") if header else ""
        journal = cls(path, key or uuid.uuid4().hex[:12])
        if resume:
            journal._load()
        journal._out = _append(path)
        journal._side = _append(side)
        if not key:
            _write(journal._side, {BATCH_KEY: journal.batch_key, "created_at_ms": now_ms()})
        return journal

    def _load(self) -> None:
        for line, row in _read_lines(self.path):
            if not isinstance(row.get("id"), str):
                raise BatchInputError(str(self.path), [(line, "not a results line")])
            self.previous[row["id"]] = row
        for line, row in _read_lines(sidecar_path(self.path)):
            if BATCH_KEY in row:
                continue  # the header
            entry_id = row.get("id")
            if not isinstance(entry_id, str):
                raise BatchInputError(str(sidecar_path(self.path)), [(line, "not a sidecar line")])
            if isinstance(row.get("trace_id"), str):
                self.submitted_ids[entry_id] = row["trace_id"]
            elif isinstance(row.get("intent_at_ms"), int):
                self.intents[entry_id] = row["intent_at_ms"]

    def resume_state(self, store: TraceStore) -> ResumeState:
        """Skip finished ids; follow submitted ones, orphans of a kill included."""
        done = frozenset(self.previous)
        attached = {i: t for i, t in self.submitted_ids.items() if i not in done}
        for entry_id, intent_ms in self.intents.items():
            if entry_id in done or entry_id in attached:
                continue
            trace_id = find_orphan(store, self.batch_key, entry_id, intent_ms)
            if trace_id is not None:
                attached[entry_id] = trace_id
                self._side_line({"id": entry_id, "trace_id": trace_id})
        return ResumeState(done_ids=done, attached=attached)

    def submitting(self, entry: BatchEntry) -> None:
        """Write-ahead: a root for this id may exist from now on."""
        self._side_line({"id": entry.id, "intent_at_ms": now_ms()})

    def submitted(self, entry: BatchEntry, trace_id: str) -> None:
        """The root exists; it is enqueued only after this line is on disk."""
        self.submitted_ids[entry.id] = trace_id
        self._side_line({"id": entry.id, "trace_id": trace_id})

    def finished(self, result: BatchResult) -> None:
        """One results line."""
        if self._out is None:
            raise ValueError("the journal is closed")
        _write(self._out, result.to_json())

    def close(self) -> None:
        """Close both files."""
        for handle in (self._out, self._side):
            if handle is not None:
                handle.close()
        self._out = self._side = None

    def _side_line(self, row: dict[str, Any]) -> None:
        if self._side is None:
            raise ValueError("the journal is closed")
        _write(self._side, row)


def find_orphan(store: TraceRecords, batch_key: str, entry_id: str, since_ms: int) -> str | None:
    """The root of `entry_id` created around `since_ms`, if the store has one.

    Reads the newest traces, widening the scan until it reaches traces older than the intent.
    """
    limit = ORPHAN_SCAN_START
    while True:
        traces = store.list_traces(limit)
        for trace in traces:
            run = trace.run  # the fleet's own marks: a line's metadata cannot claim them
            if trace.parent_trace_id is None and (run.batch, run.batch_entry) == (
                batch_key,
                entry_id,
            ):
                return trace.trace_id
        if len(traces) < limit or traces[-1].created_at_ms < since_ms - ORPHAN_SLACK_MS:
            return None
        limit *= 4


def _has_content(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def _line_count(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.is_file() else 0


def _truncate(path: Path) -> None:
    try:
        path.write_text("", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror}") from None


def _read_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line, object) per line; a torn last line (killed mid-write) is cut off the file."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with path.open("r+b") as handle:
            handle.truncate(len(data))
    rows = []
    for number, text in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            raise BatchInputError(str(path), [(number, "not a JSON object")])
        rows.append((number, row))
    return rows


def _append(path: Path) -> IO[str]:
    try:
        return path.open("a", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror}") from None


def _write(handle: IO[str], row: dict[str, Any]) -> None:
    """One line, on disk before returning."""
    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    handle.flush()
    os.fsync(handle.fileno())
