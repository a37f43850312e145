"""The counts of a chaos run: one row per backend, and the table docs/reliability.md records."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from bench.chaos_parts.backends import BACKENDS


class Shape(Protocol):
    """What the table's footer names of the run's options."""

    @property
    def seed(self) -> int:
        """The run's seed."""

    @property
    def bound_s(self) -> float:
        """Every tree ends within this long."""


@dataclass
class Row:
    """One backend's counts."""

    rounds: int = 0
    trees: int = 0
    injected: Counter[str] = field(default_factory=Counter)
    features: Counter[str] = field(default_factory=Counter)
    checked: Counter[str] = field(default_factory=Counter)
    """What the feature checks saw (batch entries answered, reflections kept, ...)."""
    ended: Counter[str] = field(default_factory=Counter)
    stuck: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    """Work that vanished with its tree still there: a batch entry with no results line, a
    reflection's proposal not kept, an experience shown to a run but not counted; and roots
    gone while Redis kept the harness's marker in their slot (the fleet's loss, not Redis's)."""
    doubled: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    cli: list[str] = field(default_factory=list)
    costs: list[str] = field(default_factory=list)
    rig: list[str] = field(default_factory=list)
    """Faults the rig could not inject (a failover that did not come): the harness's."""
    slowest_s: float = 0.0

    def findings(self) -> dict[str, list[str]]:
        """Every finding that breaks an invariant, by the table's column."""
        return {
            "stuck": self.stuck,
            "lost": self.lost,
            "doubled": self.doubled,
            "costs off": self.costs,
            "traceback": self.tracebacks,
            "secret": self.secrets,
            "CLI error": self.cli,
        }

    def counts(self) -> dict[str, int]:
        """How many findings of each column there are now (for `findings_since`)."""
        return {name: len(found) for name, found in self.findings().items()}

    def findings_since(self, counts: dict[str, int], shown: int) -> list[str]:
        """The findings added since `counts`, each named by its column (what was lost,
        doubled, off: a batch custom id, a remote task, a tool result, a turn, an entry);
        at most `shown` tracebacks and secrets, the others in full."""
        lines = []
        for name, found in self.findings().items():
            new = found[counts[name] :]
            limit = shown if name in ("traceback", "secret") else len(new)
            lines += [f"{name}: {line}" for line in new[:limit]]
            if len(new) > limit:
                lines.append(f"{name}: ... and {len(new) - limit} more")
        return lines

    @property
    def broken(self) -> bool:
        """Any invariant broken."""
        return self.breaks > 0

    @property
    def breaks(self) -> int:
        """How many findings break an invariant (a round that adds one broke it)."""
        return sum(len(f) for f in self.findings().values())


@dataclass
class Table:
    """Every backend's row, and the failing rounds' replay commands."""

    rows: dict[str, Row] = field(default_factory=lambda: {b: Row() for b in BACKENDS})
    failing: list[str] = field(default_factory=list)
    hostile: dict[str, int] = field(default_factory=dict)
    """Hostile provider answers sent, by kind (cut, nan, deep, hang)."""

    def faults(self) -> int:
        """Faults injected over every backend."""
        return sum(sum(r.injected.values()) for r in self.rows.values())

    def markdown(self, options: Shape) -> str:
        """The table docs/reliability.md records."""
        head = (
            "| backend | rounds | trees | faults | stuck | lost | gone | doubled"
            " | costs off | tracebacks | secrets | CLI errors not one line | slowest |"
        )
        lines = [head, "|" + "---|" * 13]
        for name, r in self.rows.items():
            lines.append(
                f"| {name} | {r.rounds} | {r.trees} | {sum(r.injected.values())} "
                f"| {len(r.stuck)} | {len(r.lost)} | {r.ended['gone']} | {len(r.doubled)} "
                f"| {len(r.costs)} "
                f"| {len(r.tracebacks)} "
                f"| {len(r.secrets)} | {len(r.cli)} | {r.slowest_s:.1f} s |"
            )
        kinds = Counter[str]()
        features = Counter[str]()
        checked = Counter[str]()
        for r in self.rows.values():
            kinds.update(r.injected)
            features.update(r.features)
            checked.update(r.checked)
        lines.append(
            f"\nseed {options.seed}, bound {options.bound_s:.0f} s; faults: "
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        )
        lines.append("hostile answers: " + ", ".join(f"{k} {n}" for k, n in self.hostile.items()))
        lines.append("trees: " + ", ".join(f"{k} {n}" for k, n in sorted(features.items())))
        lines.append("checked: " + ", ".join(f"{k} {n}" for k, n in sorted(checked.items())))
        return "\n".join(lines)
