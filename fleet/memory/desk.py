"""The operator's side of memory (`fleet memory ...`, `Fleet.memory`): the same rules, no model.

An operator reads, sets, removes and approves; every write is still compare-and-set when
given a version (`set --expected-version N`), and lands with `writer: operator`. Approving
lands each held recorder write on the version its recorder read: one whose key moved on
meanwhile is reported lost and dropped (the next recorder run reads the new value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.memory.board import Board
from fleet.memory.model import Entry, Proposal, Write, WriteOutcome
from fleet.memory.names import MemoryCaps, check_key, check_namespace

OPERATOR = "operator"


@dataclass(frozen=True)
class Approved:
    """One held write, approved: how its compare-and-set ended."""

    proposal: Proposal
    outcome: WriteOutcome


@dataclass(frozen=True)
class MemoryDesk:
    """Long-term memory for operators and programs: `Fleet.memory`."""

    board: Board
    caps: MemoryCaps
    """fleet.yaml's `memory:` caps, which an operator's writes are held to as well."""

    def namespaces(self) -> list[str]:
        """Every namespace with entries or held writes."""
        return self.board.namespaces()

    def entries(self, namespace: str) -> list[Entry]:
        """The namespace's current entries, by key."""
        return self.board.entries(check_namespace(namespace))

    def get(self, namespace: str, key: str) -> Entry | None:
        """One key's current entry (value and version), or None."""
        return self.board.read(check_namespace(namespace), check_key(key))

    def set(
        self, namespace: str, key: str, value: Any, expected_version: int | None = None
    ) -> WriteOutcome:
        """Write as the operator; with `expected_version`, only over that version."""
        write = Write(namespace, key, value, expected_version, OPERATOR)
        return self.board.write(write, self.caps)

    def remove(self, namespace: str, key: str) -> bool:
        """Forget a key and its history."""
        return self.board.remove(check_namespace(namespace), check_key(key))

    def history(self, namespace: str, key: str) -> list[Entry]:
        """A key's kept versions, newest first."""
        return self.board.history(check_namespace(namespace), check_key(key))

    def proposals(self, namespace: str) -> list[Proposal]:
        """The recorder writes waiting for approval."""
        return self.board.proposals(check_namespace(namespace))

    def approve(self, namespace: str, key: str | None = None) -> list[Approved]:
        """Land the held writes of the namespace (of one key), oldest first."""
        wanted = None if key is None else check_key(key)
        done = []
        for proposal in self.proposals(namespace):
            if wanted is not None and proposal.key != wanted:
                continue
            taken = self.board.take_proposal(namespace, proposal.id)
            if taken is not None:  # else another operator approved it meanwhile
                done.append(Approved(taken, self.board.write(taken.write(), self.caps)))
        return done
