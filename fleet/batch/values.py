"""What a batch is made of: its entries, options and results, its progress, and its hooks.

`fleet.batch.run` runs entries through its window with these; `fleet.batch.file` parses a
batch file into `BatchEntry`s and `fleet.batch.journal` writes `BatchResult`s and reads a
`ResumeState` back.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.batch import DEFAULT_MAX_IN_FLIGHT
from fleet.conversation.prompts import with_task
from fleet.conversation.roots import TaskSpec
from fleet.limits.budget import Budget
from fleet.runtime import Runtime
from fleet.tools.imagecheck import Image
from fleet.tools.imagesource import load_images

BATCH_KEY = "batch"
ENTRY_KEY = "batch_entry"
"""The journal's keys for the batch's key and an entry's id (a root carries both in its run
state, `run.batch` and `run.batch_entry`)."""


@dataclass(frozen=True)
class BatchEntry:
    """One task of a batch, validated."""

    id: str
    task: str
    line: int
    """Where the entry starts in its file (1-based); the position for Python iterables."""
    preset: str | None = None
    model: str | None = None
    workspace: Path | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    budget: Budget | None = None
    """What this entry's whole tree may spend."""
    batch_api: bool | None = None
    """Model calls through the provider's Batch API (None: the model alias's default)."""
    images: tuple[str, ...] = ()
    """Paths inside the entry's workspace, or http(s) URLs (`fleet.tools.imagesource`)."""
    memory: tuple[str, ...] = ()
    """Long-term memory namespaces the entry's tree may use (`fleet.memory`)."""
    prompt: str | None = None
    """A prompt file inside the entry's workspace, in place of `task` (`variables` fill it)."""
    variables: Mapping[str, str] = field(default_factory=dict)


def entry_images(runtime: Runtime, entry: BatchEntry) -> tuple[Image, ...]:
    """The entry's images, each path confined to the entry's workspace; `ConfigError` if not."""
    if not entry.images:
        return ()
    settings = runtime.settings.with_workspace(entry.workspace or runtime.settings.workspace)
    return load_images(
        entry.images,
        workspace=settings.workspace,
        web_allow=settings.web_allow,
        private=settings.private_dirs,
    )


def entry_spec(runtime: Runtime, entry: BatchEntry, metadata: Mapping[str, Any]) -> TaskSpec:
    """The entry's root as a `TaskSpec` (its prompt file read inside its workspace).

    Raises:
        ConfigError: the prompt file is refused (outside the workspace, too big, a
            variable missing).
    """
    spec = TaskSpec("", entry.model, entry.preset or "default", entry.workspace, "main", metadata)
    if entry.prompt is None:
        return with_task(spec, entry.task, None, None)
    settings = runtime.settings.with_workspace(entry.workspace or runtime.settings.workspace)
    return with_task(
        spec,
        None,
        Path(entry.prompt),
        entry.variables,
        workspace=settings.workspace,
        private=settings.private_dirs,
    )


@dataclass(frozen=True)
class BatchResult:
    """How one task ended: a line of the results file."""

    id: str
    trace_id: str
    status: str
    """The root's terminal status (completed, failed, stopped); `failed` if the trace is gone;
    `waiting` when it asked a person (`fleet reply` resumes it)."""
    answer: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    question: str | None = None
    """What the root asked a person, when it ended the batch `waiting`."""
    budget: Mapping[str, Any] | None = None
    """The tree's budget (limit, used, reserved) when it had one."""

    def to_json(self) -> dict[str, Any]:
        """The results-file object."""
        out = {
            "id": self.id,
            "trace_id": self.trace_id,
            "status": self.status,
            "answer": self.answer,
            "stats": dict(self.stats),
            "error": self.error,
        } | ({"question": self.question} if self.question is not None else {})
        if self.budget is not None:
            out["budget"] = dict(self.budget)
        return out


POLL_MS = 20
"""How long a blocking event read waits when no root moved; doubled per quiet step up to
`fleet.batch.run.MAX_POLL_MS`."""


@dataclass(frozen=True)
class BatchOptions:
    """How a batch runs."""

    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    """Most unfinished roots at any time."""
    timeout_s: float | None = None
    """Per task, from its submission (or re-attachment): then it is stopped."""
    batch_key: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    """Stamped into each root's run state (`run.batch`); the journal finds orphans by it."""
    poll_ms: int = POLL_MS


@dataclass(frozen=True)
class ResumeState:
    """What an earlier run of the same batch left: finished ids and submitted roots."""

    done_ids: frozenset[str] = frozenset()
    attached: Mapping[str, str] = field(default_factory=dict)
    """Entry id -> trace id of roots submitted but not finished: followed, never resubmitted."""


@dataclass
class BatchCounts:
    """The progress of a batch, updated on every step of the window."""

    total: int
    done: int = 0
    """Completed."""
    failed: int = 0
    """Failed, stopped or timed out."""
    waiting: int = 0
    """Waiting on a person (`ask_human`): left for `fleet reply`, no longer followed."""
    running: int = 0
    """Roots a worker runs (or that wait on their sub-agents)."""
    queued: int = 0
    """Submitted roots no worker has started yet."""
    pending: int = 0
    """Entries not submitted yet."""
    sub_agents: int = 0
    """Live sub-agents under the in-flight roots."""
    skipped: int = 0
    """Finished in an earlier run (resume)."""
    in_batches: int = 0
    """Model calls queued for or held in provider batches, fleet-wide (`fleet.batchapi`)."""
    oldest_batch_s: float | None = None
    """How long the oldest of them has waited."""


class BatchHooks:
    """Typed no-op hooks; the results journal and the progress display override them."""

    def submitting(self, entry: BatchEntry) -> None:
        """Before the root is created: a write-ahead point."""

    def submitted(self, entry: BatchEntry, trace_id: str) -> None:
        """The root exists and is about to be enqueued."""

    def finished(self, result: BatchResult) -> None:
        """A root ended (or a re-attached one was found gone)."""

    def progress(self, counts: BatchCounts) -> None:
        """After every step of the window."""


class ChainHooks(BatchHooks):
    """Several hooks called in order."""

    def __init__(self, *hooks: BatchHooks) -> None:
        """Call each of `hooks` in turn."""
        self.hooks = hooks

    def submitting(self, entry: BatchEntry) -> None:
        """See `BatchHooks`."""
        for hook in self.hooks:
            hook.submitting(entry)

    def submitted(self, entry: BatchEntry, trace_id: str) -> None:
        """See `BatchHooks`."""
        for hook in self.hooks:
            hook.submitted(entry, trace_id)

    def finished(self, result: BatchResult) -> None:
        """See `BatchHooks`."""
        for hook in self.hooks:
            hook.finished(result)

    def progress(self, counts: BatchCounts) -> None:
        """See `BatchHooks`."""
        for hook in self.hooks:
            hook.progress(counts)
