"""Which web domains `web_search` and `web_fetch` may touch, on top of the SSRF guard.

fleet.yaml sets the fleet's filter (`web: {allow_domains, deny_domains}`) and a preset file
may set its own (`web:` in the frontmatter). A URL must pass **every** layer: the preset's
is added to fleet.yaml's, never put in its place, so a preset can only narrow. Patterns are
globs on the host name: `python.org` is that host, `*.python.org` any name under it (not
`python.org` itself: list both). The SSRF guard (`fleet.tools.netguard`) still runs on
every hop: a filter never lets a URL reach an address the guard refuses.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleet.errors import ToolError

_PATTERN = re.compile(r"^[a-z0-9*][a-z0-9.*-]*$")
MAX_PATTERNS = 500


class WebSection(BaseModel):
    """`web:` of fleet.yaml or of a preset file, validated at the edge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_domains: tuple[str, ...] | None = Field(default=None, max_length=MAX_PATTERNS)
    """Only these hosts (globs); None: any host."""
    deny_domains: tuple[str, ...] = Field(default=(), max_length=MAX_PATTERNS)
    """Never these hosts (globs), whatever `allow_domains` says."""

    @field_validator("allow_domains", "deny_domains")
    @classmethod
    def _patterns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(check_pattern(p) for p in value)

    def rules(self) -> DomainRules:
        """The section as one filter layer."""
        return DomainRules(self.allow_domains, self.deny_domains)


def check_pattern(pattern: str) -> str:
    """A domain glob, lower-cased; `ValueError` names a malformed one."""
    normal = pattern.strip().lower().rstrip(".")
    if not _PATTERN.match(normal):
        raise ValueError(
            f"domain pattern {pattern[:80]!r}: use letters, digits, '.', '-' and '*'"
            " (e.g. '*.python.org')"
        )
    return normal


@dataclass(frozen=True)
class DomainRules:
    """One filter layer.

    A host passes if some `allow` glob matches it (or `allow` is None) and no `deny` glob does.
    """

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()

    def refusal(self, host: str) -> str | None:
        """Why `host` (normalised) is refused by this layer, or None."""
        if any(fnmatch.fnmatchcase(host, pattern) for pattern in self.deny):
            return "it matches deny_domains"
        if self.allow is not None and not any(
            fnmatch.fnmatchcase(host, pattern) for pattern in self.allow
        ):
            return "it is not in allow_domains"
        return None


@dataclass(frozen=True)
class DomainFilter:
    """Every layer a URL must pass (fleet.yaml's, the preset's, a call's `domains`)."""

    layers: tuple[DomainRules, ...] = ()

    def narrowed(self, rules: DomainRules | None) -> DomainFilter:
        """A copy with one more layer: it can refuse more, never less."""
        return self if rules is None else DomainFilter((*self.layers, rules))

    def refusal(self, url: str) -> str | None:
        """Why `url` is refused, or None when every layer lets it through."""
        if not self.layers:
            return None
        host = host_of(url)
        if host is None:
            return f"{url[:200]!r} has no host name a domain filter can check"
        for layer in self.layers:
            if (why := layer.refusal(host)) is not None:
                return f"{host!r} is refused: {why}"
        return None

    def check(self, url: str, tool: str) -> None:
        """Raise `ToolError` naming the tool and the reason when `url` is refused."""
        why = self.refusal(url)
        if why is not None:
            raise ToolError(f"{tool} refuses {why} (web: filters in fleet.yaml or the preset)")


OPEN = DomainFilter()
"""No filter: every host passes (the SSRF guard still runs)."""


def host_of(url: str) -> str | None:
    """The host as the resolver will see it: IDNA-encoded, lower case, no trailing dot.

    A filter compares this spelling, so `PYTHON.org.` and full-width letters (which the
    resolver maps to ASCII) cannot slip past a pattern written in plain ASCII.
    """
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    if not host:
        return None
    try:
        ascii_host = host.rstrip(".").encode("idna").decode("ascii")
    except UnicodeError:
        return None
    return ascii_host.lower() or None
