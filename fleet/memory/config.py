"""How presets and fleet.yaml ask for memory: `memory:` in a preset file and in fleet.yaml.

A preset's `memory:` is `read`, `write`, or `{access, inject, record, review}`:

    memory: read                                   # memory_read, memory_search
    memory: {access: read, inject: [profile]}      # and a `## Memory` block
    memory: {record: true, review: true}           # a recorder after each root; held writes

fleet.yaml's `memory:` holds the caps and the fleet-wide `record` / `review`:

    memory:
      record: true
      review: false
      max_value_bytes: 16000
      max_keys: 1000
      history_depth: 20
      ttl_s: {user: 7776000, "project:acme": 0}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleet.memory.names import MemoryCaps, check_key, check_namespace

Access = Literal["none", "read", "write"]
READ_TOOLS = ("memory_read", "memory_search")
WRITE_TOOL = "memory_write"
MEMORY_TOOLS = frozenset({*READ_TOOLS, WRITE_TOOL})
"""The memory tools; the runner executes them (`fleet.memory.tools`)."""
MAX_INJECTED_KEYS = 10


@dataclass(frozen=True)
class MemoryUse:
    """What a preset does with the tree's bound namespaces."""

    access: Access = "none"
    """`read`: memory_read and memory_search; `write`: memory_write too (never when the run
    is read-only: explore and evaluate, a read-only preset or ceiling)."""
    inject: tuple[str, ...] = ()
    """Keys shown in a `## Memory` block of the system prompt, from each bound namespace."""
    record: bool = False
    """When a root of this preset ends, a recorder run extracts facts into its namespaces."""
    review: bool = False
    """The recorder's writes wait for `fleet memory approve`."""

    def tools(self) -> frozenset[str]:
        """The memory tools this access offers."""
        if self.access == "write":
            return MEMORY_TOOLS
        return frozenset(READ_TOOLS) if self.access == "read" else frozenset()


NO_MEMORY = MemoryUse()


class MemorySectionIn(BaseModel):
    """A preset file's `memory:` block, validated at the edge."""

    model_config = ConfigDict(extra="forbid")
    access: Access = "read"
    inject: list[str] = Field(default_factory=list, max_length=MAX_INJECTED_KEYS)
    record: bool = False
    review: bool = False

    @field_validator("inject")
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        return [check_key(k, "memory.inject") for k in keys]

    def use(self) -> MemoryUse:
        """The preset's `MemoryUse`."""
        return MemoryUse(self.access, tuple(self.inject), self.record, self.review)


def use_of(section: Access | MemorySectionIn | None) -> MemoryUse:
    """`memory: read` / `write` / `{...}` as a `MemoryUse`."""
    if section is None:
        return NO_MEMORY
    return MemoryUse(section) if isinstance(section, str) else section.use()


class FleetMemorySection(BaseModel):
    """fleet.yaml's `memory:` block: caps and the fleet-wide recorder policy."""

    model_config = ConfigDict(extra="forbid")
    record: bool = False
    """A recorder run after every root with bound namespaces, whatever its preset says."""
    review: bool = False
    """Every recorder write waits for `fleet memory approve`."""
    max_value_bytes: int = Field(default=16_000, ge=1, le=1_000_000)
    max_keys: int = Field(default=1_000, ge=1, le=1_000_000)
    history_depth: int = Field(default=20, ge=1, le=1_000)
    ttl_s: dict[str, int] = Field(default_factory=dict)

    @field_validator("ttl_s")
    @classmethod
    def _ttls(cls, ttl_s: dict[str, int]) -> dict[str, int]:
        for name, seconds in ttl_s.items():
            if ":" in name or name == "fleet":
                check_namespace(name, "memory.ttl_s")
            elif not name.isidentifier():
                raise ValueError(f"memory.ttl_s: {name[:60]!r} is neither a namespace nor a kind")
            if seconds < 0:
                raise ValueError(f"memory.ttl_s: {name!r}: {seconds} is negative")
        return ttl_s

    def caps(self) -> MemoryCaps:
        """The caps every write is held to."""
        return MemoryCaps(self.max_value_bytes, self.max_keys, self.history_depth, self.ttl_s)
