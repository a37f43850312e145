"""Tree budgets: what a whole delegation tree may spend, reserved before every model call.

A root may carry a `Budget(tokens, usd, sub_agents, depth, wall_s)`. Its state is one Redis
hash per root (`keys.budget`; `backends.redis.budgets.Budgets`, its twin
`backends.memory.trees.MemoryBudgets`), shared by every branch on every worker:

- Before each model call a trace reserves its estimate (input estimate + the longest
  answer, and that in USD); the call goes only if `used + reserved + final + estimate`
  fits. The reservations in flight are one field per trace (`keys.budget_held`).
- After the call its reservation is replaced by what it really used.
- A tenth of the tokens/usd is set aside up front for the root's one final turn (`final`).
- When a reservation does not fit (or `wall_s` has passed) the tree is `exhausted`: every
  later reservation is refused, branches end `stopped` (stop_reason "budget") after the
  call they are in, spawning stops, and the root gets its final turn (the set-aside) to
  answer from what it has, then ends `completed` with stop_reason "budget".

**Overshoot bound.** Admission guarantees used + reserved <= limit. A call overshoots its
reservation only by what its real usage exceeds its estimate: the answer cannot (the
estimate books `max_output_tokens`, which is sent as `max_tokens`), the input estimate
books one token per 3 characters (English runs ~4). So the tree's spend is at most the
limit plus, over the calls in flight when it ran out, their input under-estimates, plus
what the root's final turn uses beyond its set-aside. For a model without
`max_output_tokens` in fleet.yaml, 4096 is booked and a longer answer adds its excess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, astuple, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from fleet.config.limits import Amount, Count, PositiveCount, validated
from fleet.models import now_ms

FINAL_SHARE = 0.1
"""Share of a token/usd budget set aside for the root's final turn."""


@dataclass(frozen=True)
class Budget:
    """What one tree may spend. None means no limit on that dimension."""

    tokens: int | None = None
    """Prompt + completion tokens of every model call in the tree."""
    usd: float | None = None
    """Cost of those calls (fleet.yaml prices or the built-in table)."""
    sub_agents: int | None = None
    """Children the tree may spawn in all."""
    depth: int | None = None
    """How deep sub-agents may go below the root (0: none at all)."""
    wall_s: float | None = None
    """Seconds from submission until the tree stops spending."""

    def __post_init__(self) -> None:
        """Refuse what no budget can mean (`fleet.config.limits`), whoever builds it.

        Raises:
            InvalidLimit: a negative, zero, NaN or infinite value, named with its field.
        """
        validated(BudgetIn, asdict(self), prefix="budget.")

    @property
    def empty(self) -> bool:
        """True when nothing is limited."""
        # Not `self == Budget()`: each Budget is validated when built, on every submit.
        return all(value is None for value in astuple(self))

    def over(self, default: Budget | None) -> Budget:
        """A copy with `default` filling the dimensions this one leaves open."""
        if default is None:
            return self
        mine, theirs = asdict(self), asdict(default)
        return Budget(**{k: theirs[k] if v is None else v for k, v in mine.items()})


class BudgetIn(BaseModel):
    """A budget as written anywhere (API, CLI, batch entry, preset): the one validation."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tokens: PositiveCount | None = None
    usd: Amount | None = None
    sub_agents: Count | None = None
    depth: Count | None = None
    wall_s: Amount | None = None

    def to_budget(self) -> Budget:
        """The dataclass used inside."""
        return Budget(**self.model_dump())


NO_BUDGET = Budget()
"""A tree with no budget of its own (built once: each `Budget` is validated when built)."""


@dataclass(frozen=True)
class BudgetState:
    """A tree's budget as `fleet trace show` prints it: limit, used, reserved."""

    limit: Budget
    used_tokens: int
    used_usd: float
    used_sub_agents: int
    reserved_tokens: int
    """In flight now, plus the root's final turn while it is still set aside."""
    reserved_usd: float
    exhausted: str | None
    """Why the tree stopped spending (tokens, usd, wall_s), or None."""

    def to_json(self) -> dict[str, Any]:
        """The `budget` object of `fleet trace show --json`."""
        return {
            "limit": asdict(self.limit),
            "used": {
                "tokens": self.used_tokens,
                "usd": round(self.used_usd, 6),
                "sub_agents": self.used_sub_agents,
            },
            "reserved": {"tokens": self.reserved_tokens, "usd": round(self.reserved_usd, 6)},
            "exhausted": self.exhausted,
        }

    def line(self) -> str:
        """One human line: `budget: 31200/40000 tokens (+5000 reserved), ...`."""
        parts = []
        lim = self.limit
        if lim.tokens is not None:
            parts.append(
                f"{self.used_tokens}/{lim.tokens} tokens (+{self.reserved_tokens} reserved)"
            )
        if lim.usd is not None:
            parts.append(f"${self.used_usd:.4f}/${lim.usd:g}")
        if lim.sub_agents is not None:
            parts.append(f"{self.used_sub_agents}/{lim.sub_agents} sub-agents")
        if self.exhausted:
            parts.append(f"exhausted: {self.exhausted}")
        return "budget: " + (", ".join(parts) or "no limits")


@dataclass(frozen=True)
class Reserved:
    """Go: the estimate is reserved. `final`: this is the root's last, set-aside turn."""

    final: bool = False
    budgeted: bool = True
    kind: Literal["reserved"] = "reserved"


@dataclass(frozen=True)
class Exhausted:
    """The tree's budget is spent: stop after what you have."""

    reason: str
    kind: Literal["exhausted"] = "exhausted"


@dataclass(frozen=True)
class Paused:
    """The call's provider is paused fleet-wide (checked in the same step): nothing reserved."""

    retry_in_s: float
    kind: Literal["paused"] = "paused"


Reservation = Reserved | Exhausted | Paused
UNBUDGETED = Reserved(budgeted=False)


def budget_fields(budget: Budget) -> dict[str, Any]:
    """A new tree's budget hash (`keys.budget`): limits, deadline, set-aside, nothing used."""
    fields: dict[str, Any] = {}
    for name in ("tokens", "usd", "sub_agents", "depth"):
        value = getattr(budget, name)
        if value is not None:
            fields[f"limit_{name}"] = value
    if budget.wall_s is not None:
        fields["limit_wall_s"] = budget.wall_s
        fields["deadline_ms"] = now_ms() + int(budget.wall_s * 1000)
    if budget.tokens is not None:
        fields["final_tokens"] = int(budget.tokens * FINAL_SHARE)
    if budget.usd is not None:
        fields["final_usd"] = budget.usd * FINAL_SHARE
    return fields | {"used_tokens": 0, "used_usd": 0, "used_sub_agents": 0}


def spawn_refusal(why: str, left: int, children: int, depth: int) -> str:
    """What the model reads when its spawn is refused (`why`: sub_agents, depth or spent)."""
    if why == "sub_agents":
        return (
            f"budget: this tree may start {left} more sub-agent(s); this call asks for {children}"
        )
    if why == "depth":
        return f"budget: sub-agents may not go deeper than depth {depth - 1}"
    return f"budget: the tree's {why} budget is spent; answer with what you have"


def state_of(data: Mapping[str, str], held: list[str]) -> BudgetState:
    """A budget hash and its held reservations (`"tokens usd"` each) as a `BudgetState`."""

    def num(name: str) -> float | None:
        return float(data[name]) if name in data else None

    pairs = [v.split() for v in held]
    limit = Budget(
        tokens=_int(num("limit_tokens")),
        usd=num("limit_usd"),
        sub_agents=_int(num("limit_sub_agents")),
        depth=_int(num("limit_depth")),
        wall_s=num("limit_wall_s"),
    )
    return BudgetState(
        limit=limit,
        used_tokens=int(num("used_tokens") or 0),
        used_usd=num("used_usd") or 0.0,
        used_sub_agents=int(num("used_sub_agents") or 0),
        reserved_tokens=int(sum(float(p[0]) for p in pairs) + (num("final_tokens") or 0)),
        reserved_usd=sum(float(p[1]) for p in pairs) + (num("final_usd") or 0.0),
        exhausted=data.get("exhausted"),
    )


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
