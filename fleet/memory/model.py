"""One memory entry, one write and how it ended: validated at the edges (Redis, CLI, tools)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from fleet.errors import MemoryRefused
from fleet.memory.names import MemoryCaps, check_key, check_namespace
from fleet.models import Record, now_ms


class Entry(Record):
    """One version of a key's value, with where it came from."""

    namespace: str
    key: str
    value: Any
    """Any JSON value."""
    version: int
    """1 for a new key, one more for each write that landed."""
    updated_at_ms: int
    source_trace: str | None = None
    """The trace whose run wrote it; None for an operator's `fleet memory set`."""
    writer: str
    """Who wrote it: `recorder`, `trace:PRESET`, `operator`."""
    write_id: str | None = None
    """The writer's idempotency key: a redelivered write with the same id lands nothing."""


@dataclass(frozen=True)
class Write:
    """A compare-and-set write of one key, as every backend takes it."""

    namespace: str
    key: str
    value: Any
    expected_version: int | None
    """The version the writer read (0: the key must be new); None writes whatever is there
    (the operator's `fleet memory set` without `--expected-version`)."""
    writer: str
    source_trace: str | None = None
    write_id: str | None = None
    """Idempotency key (`RECORDER_TRACE:KEY`): a write whose id is in the key's history
    lands nothing and reports the version it landed as."""

    def checked(self, caps: MemoryCaps) -> str:
        """The value's JSON, or `MemoryRefused` for a bad name or a value over the cap."""
        check_namespace(self.namespace)
        check_key(self.key)
        if self.expected_version is not None and self.expected_version < 0:
            raise MemoryRefused(f"memory: expected_version {self.expected_version} is negative")
        try:
            text = json.dumps(self.value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise MemoryRefused(f"memory: {self.key!r}: value is not JSON ({why})") from None
        size = len(text.encode())
        if size > caps.max_value_bytes:
            raise MemoryRefused(
                f"memory: {self.key!r}: value of {size} bytes is over the cap of"
                f" {caps.max_value_bytes} bytes"
            )
        return text

    def entry(self, version: int, now_ms: int) -> Entry:
        """The entry this write lands as."""
        return Entry(
            namespace=self.namespace,
            key=self.key,
            value=self.value,
            version=version,
            updated_at_ms=now_ms,
            source_trace=self.source_trace,
            writer=self.writer,
            write_id=self.write_id,
        )


@dataclass(frozen=True)
class Landed:
    """The write landed as `version` (or had landed already, when `duplicate`)."""

    version: int
    duplicate: bool = False


@dataclass(frozen=True)
class Lost:
    """Another write got there first: the key is at `current_version` (0: absent)."""

    current_version: int


WriteOutcome = Landed | Lost


class Proposal(Record):
    """A recorder write held for a person's `fleet memory approve` (`memory: {review: true}`)."""

    id: str
    namespace: str
    key: str
    value: Any
    expected_version: int | None
    source_trace: str | None
    writer: str
    proposed_at_ms: int

    def write(self) -> Write:
        """The write it becomes once approved (compare-and-set on the version it read)."""
        return Write(
            self.namespace,
            self.key,
            self.value,
            self.expected_version,
            self.writer,
            self.source_trace,
            write_id=self.id,
        )


def proposal_of(write: Write) -> Proposal:
    """The waiting form of a write; its id is the write's idempotency key when it has one."""
    return Proposal(
        id=write.write_id or f"mem-{uuid.uuid4().hex[:12]}",
        namespace=write.namespace,
        key=write.key,
        value=write.value,
        expected_version=write.expected_version,
        source_trace=write.source_trace,
        writer=write.writer,
        proposed_at_ms=now_ms(),
    )


def full_error(namespace: str, caps: MemoryCaps) -> MemoryRefused:
    """The refusal of a new key in a full namespace (both backends say the same)."""
    return MemoryRefused(
        f"memory: namespace {namespace!r} holds {caps.max_keys} keys, its cap: remove one first"
    )
