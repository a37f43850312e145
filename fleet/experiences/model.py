"""One experience: a rule learnt from earlier runs, validated at the edges (Redis, CLI)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from array import array
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from fleet.errors import ConfigError
from fleet.llm.embeddings import Vector
from fleet.models import Record, now_ms

Source = Literal["execution", "feedback", "manual"]
SCOPE_KINDS = ("agent", "user", "project")
_SCOPE = re.compile(r"(agent|user|project):[A-Za-z0-9_.@-]{1,100}")
MAX_TEXT_CHARS = 1000


class Experience(Record):
    """When `condition`, then `rule`; injected only once `approved` (a stored `Record`)."""

    id: str
    scope: str
    """`agent:PRESET`, `user:NAME` or `project:NAME`: which runs may see it."""
    condition: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    rule: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    evidence: list[str] = Field(default_factory=list)
    """The traces (and messages) it was learnt from."""
    source: Source = "manual"
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    approved: bool = False
    uses: int = 0
    """Runs it was injected into."""
    successes: int = 0
    """Of those, the runs that completed."""
    created_at_ms: int = Field(default_factory=now_ms)

    @property
    def success_rate(self) -> float | None:
        """The share of its uses that completed; None before its first use."""
        return self.successes / self.uses if self.uses else None


def check_scope(scope: str) -> str:
    """The scope, or `ConfigError` saying what a scope looks like."""
    if not _SCOPE.fullmatch(scope):
        raise ConfigError(
            f"scope {scope!r}: expected agent:NAME, user:NAME or project:NAME"
            " (letters, digits, _ . @ -)"
        )
    return scope


def new_experience(
    scope: str,
    condition: str,
    rule: str,
    *,
    source: Source = "manual",
    evidence: list[str] | None = None,
    approved: bool = False,
) -> Experience:
    """A new experience with a fresh id; `ConfigError` for a bad scope or empty text."""
    condition, rule = " ".join(condition.split()), " ".join(rule.split())
    if not condition or not rule:
        raise ConfigError("an experience needs a non-empty condition and rule")
    if len(condition) > MAX_TEXT_CHARS or len(rule) > MAX_TEXT_CHARS:
        raise ConfigError(f"condition and rule are at most {MAX_TEXT_CHARS} characters each")
    return Experience(
        id=f"exp-{uuid.uuid4().hex[:12]}",
        scope=check_scope(scope),
        condition=condition,
        rule=rule,
        source=source,
        evidence=list(evidence or []),
        approved=approved,
    )


@dataclass(frozen=True)
class StoredVector:
    """An experience's embedding, with what it was computed from (to notice a stale one)."""

    model: str
    """The embedding alias it came from: another model's vector is not compared."""
    digest: str
    """`text_digest` of the text embedded: an edited experience's old vector is not used."""
    values: Vector

    def encode(self) -> str:
        """JSON with the vector as base64 float32 (a quarter of its decimal text)."""
        packed = base64.b64encode(array("f", self.values).tobytes()).decode()
        return json.dumps({"model": self.model, "digest": self.digest, "f32": packed})

    @classmethod
    def decode(cls, raw: str | bytes) -> StoredVector | None:
        """What `encode` wrote; None for anything else (read as "no vector yet")."""
        try:
            data = json.loads(raw)
            values = array("f")
            values.frombytes(base64.b64decode(data["f32"], validate=True))
            return cls(str(data["model"]), str(data["digest"]), tuple(values))
        except (ValueError, KeyError, TypeError):
            return None


def embedding_text(experience: Experience) -> str:
    """What is embedded for an experience: its condition, then its rule."""
    return f"{experience.condition}\n{experience.rule}"


def text_digest(experience: Experience) -> str:
    """A short hash of `embedding_text`, stored beside the vector."""
    return hashlib.sha256(embedding_text(experience).encode()).hexdigest()[:16]
