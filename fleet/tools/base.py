"""What a tool receives and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fleet.config.shell import ShellLimits
from fleet.config.webfilter import OPEN, DomainFilter
from fleet.tools.imagecheck import Image
from fleet.tools.websearch.cache import SearchCache
from fleet.tools.websearch.results import SearchResult


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer: shown once in full, then replaced by `long_term_memory` if set."""

    title: str
    output: str
    long_term_memory: str | None = None
    is_error: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    images: tuple[Image, ...] = ()
    """Images the model sees with the output (checked; stored once per tree by reference)."""


class WebSearcher(Protocol):
    """The fleet's search provider, as `web_search` uses it (`fleet.tools.websearch.service`)."""

    def search(
        self, query: str, count: int, *, trace_id: str, root_trace_id: str, timeout_s: float
    ) -> list[SearchResult]:
        """At most `count` results; `ToolError` for anything the model should be told."""
        ...


@dataclass(frozen=True)
class ToolContext:
    """Where and for whom a tool runs. `allow_shell` is already ANDed with the env switch."""

    workspace: Path
    trace_id: str = ""
    root_trace_id: str = ""
    """The tree's root: what its search budget is counted against."""
    preset: str = "default"
    allow_shell: bool = False
    skills_dirs: tuple[Path, ...] = ()
    output_limit_chars: int = 30_000
    bash_timeout_s: float = 60.0
    web_timeout_s: float = 20.0
    shell_env: tuple[str, ...] = ()
    """Variable names bash may see besides the fixed allow-list (FLEET_SHELL_ENV)."""
    shell_limits: ShellLimits = field(default_factory=ShellLimits)
    web_allow: tuple[str, ...] = ()
    """Hosts, IPs or CIDRs web_fetch may reach although not public (FLEET_WEB_ALLOW)."""
    tool_timeout_s: float = 30.0
    """Wall-clock limit of one tool call; the slot is freed when it passes."""
    private_dirs: tuple[Path, ...] = ()
    """The fleet's state folders (`Settings.private_dirs`): no file tool opens them, even
    inside the workspace."""
    web_filter: DomainFilter = OPEN
    """fleet.yaml's `web:` filter narrowed by the preset's: every URL web_search returns
    and every hop web_fetch takes must pass it (on top of the SSRF guard)."""
    search: WebSearcher | None = None
    """The operator's search provider (`search:` in fleet.yaml); None: web_search is off."""
    search_cache: SearchCache | None = None
    """The preset's cache of `web_search` answers (`cache: {tools: [web_search]}`)."""
