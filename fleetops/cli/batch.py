"""`fleet batch FILE`: many tasks through the fleet, a bounded window, a resumable results file.

Exit codes: 0 every task completed, 1 some did not, 2 bad input (nothing submitted),
130 interrupted (submitting stopped; submitted tasks keep running; `--resume` follows them).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from fleet.batch.file import check_entries, load_entries, with_defaults
from fleet.batch.journal import ResultsJournal
from fleet.batch.run import (
    BatchCounts,
    BatchEntry,
    BatchHooks,
    BatchOptions,
    BatchResult,
    ChainHooks,
    ResumeState,
    run_batch,
)
from fleet.errors import ConfigError
from fleet.inprocess import InProcessDispatcher
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.output import printable

PLAIN_STATUS_EVERY_S = 10.0
"""Without a terminal, a counts line this often besides one line per finished task."""
SHOWN_FAILURES = 10


def run_batch_command(args: argparse.Namespace) -> int:
    """Validate every entry, then run the batch with progress; see the module doc for exits."""
    from fleetops.discovery import fleet_settings

    if args.resume and args.out is None:
        raise ConfigError("--resume needs --out (the results file to continue)")
    settings = fleet_settings()
    batch_api = True if args.batch_api else None
    workspace = args.workspace.expanduser().resolve() if args.workspace else None
    entries = with_defaults(
        load_entries(args.file),
        model=args.model,
        preset=args.preset,
        batch_api=batch_api,
        workspace=workspace,
    )
    check_entries(validation_runtime(settings), entries, str(args.file))
    if args.dry_run:
        print(f"{args.file}: {len(entries)} task(s) OK")
        return ExitCode.OK
    return _run(args, entries)


def validation_runtime(settings: Settings) -> Runtime:
    """A runtime for checks only: presets and models from the config, no Redis."""
    return Runtime.build(settings, MemoryStore(), InProcessDispatcher())


def _run(args: argparse.Namespace, entries: list[BatchEntry]) -> int:
    from fleetops.cli.run import connect, require_workers

    fleet = connect()
    require_workers(fleet, "fleet.main")
    journal = ResultsJournal.open(args.out, resume=args.resume) if args.out else None
    resume = journal.resume_state(fleet.store) if journal else ResumeState()
    options = BatchOptions(max_in_flight=args.max_in_flight, timeout_s=args.timeout_s)
    if journal:
        options = replace(options, batch_key=journal.batch_key)
    view = RichProgress(len(entries)) if sys.stdout.isatty() else PlainProgress(len(entries))
    results: dict[str, dict[str, Any]] = dict(journal.previous) if journal else {}
    started_s = time.monotonic()
    hooks = ChainHooks(*(h for h in (journal, view) if h is not None))
    try:
        with view:
            for result in run_batch(fleet, entries, options, resume=resume, hooks=hooks):
                results[result.id] = result.to_json()
    except KeyboardInterrupt:
        _say_interrupted(args, len(results))
        return ExitCode.INTERRUPTED
    finally:
        if journal:
            journal.close()
    ran = len(results) - len(resume.done_ids)
    print_summary(results.values(), time.monotonic() - started_s, ran)
    statuses = {row["id"]: row["status"] for row in results.values()}
    failed = any(statuses.get(e.id) != "completed" for e in entries)
    return ExitCode.FAILED if failed else ExitCode.OK


def _say_interrupted(args: argparse.Namespace, finished: int) -> None:
    if args.out:
        again = f"fleet batch {args.file} --out {args.out} --resume"
        hint = f"submitted tasks keep running; `{again}` follows them"
    else:
        hint = "submitted tasks keep running (without --out a batch cannot resume)"
    print(f"interrupted after {finished} finished: {hint}", file=sys.stderr)


class PlainProgress(BatchHooks):
    """Line output for logs: one line per finished task, a counts line now and then."""

    def __init__(self, total: int) -> None:
        """Count against `total` entries."""
        self.total = total
        self.finished_count = 0
        self._said_s = time.monotonic()
        self._counts: BatchCounts | None = None

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def finished(self, result: BatchResult) -> None:
        """`[ 37/200] completed line-37 TRACE_ID`."""
        self.finished_count += 1
        done = self.finished_count + (self._counts.skipped if self._counts else 0)
        width = len(str(self.total))
        error = f"  {_one_line(result.error)}" if result.error else ""
        line = f"[{done:>{width}}/{self.total}] {result.status:<9} {result.id}  {result.trace_id}"
        print(printable(line + budget_text(result) + error), flush=True)

    def progress(self, counts: BatchCounts) -> None:
        """A counts line every PLAIN_STATUS_EVERY_S."""
        self._counts = counts
        if time.monotonic() - self._said_s >= PLAIN_STATUS_EVERY_S:
            self._said_s = time.monotonic()
            print(counts_text(counts), flush=True)


class RichProgress(BatchHooks):
    """A live bar (done of total, rate, ETA) over a counts line (failed, running, queued, ...)."""

    def __init__(self, total: int) -> None:
        """A bar over `total` entries."""
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("[bold]batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        self.task = self.bar.add_task("batch", total=total, rate="")
        self.counts_line = ""
        self.live = Live(get_renderable=self._renderable, refresh_per_second=8)
        self._started_s = time.monotonic()
        self._finished = 0

    def _renderable(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        return Group(self.bar, Text(self.counts_line, style="dim"))

    def __enter__(self) -> RichProgress:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def finished(self, result: BatchResult) -> None:
        """Count toward the rate; a failure gets a line above the bar."""
        self._finished += 1
        if result.status != "completed":
            line = f"✗ {result.id} {result.status}: {_one_line(result.error or '')}"
            self.live.console.print(printable(line), style="red", markup=False, highlight=False)
        elif budget := budget_text(result):
            line = f"✓ {result.id}{budget}"
            self.live.console.print(printable(line), style="yellow", markup=False, highlight=False)

    def progress(self, counts: BatchCounts) -> None:
        """Move the bar and refresh the counts."""
        elapsed_s = max(time.monotonic() - self._started_s, 1e-6)
        self.counts_line = counts_text(counts)
        self.bar.update(
            self.task,
            completed=counts.done + counts.failed + counts.skipped,
            rate=f"{self._finished / elapsed_s:.1f}/s",
        )


def budget_text(result: BatchResult) -> str:
    """`  budget 31200/40000 tok (budget)` for a task that had a budget, else ""."""
    if not result.budget:
        return ""
    used, limit = result.budget["used"], result.budget["limit"]
    parts = []
    if limit.get("tokens") is not None:
        parts.append(f"{used['tokens']}/{limit['tokens']} tok")
    if limit.get("usd") is not None:
        parts.append(f"${used['usd']:.4f}/${limit['usd']:g}")
    ran_out = f" (ran out: {result.budget['exhausted']})" if result.budget.get("exhausted") else ""
    return f"  budget {' '.join(parts)}{ran_out}" if parts or ran_out else ""


def counts_text(counts: BatchCounts) -> str:
    """`done 35  failed 2  running 20  queued 143  sub-agents 4`."""
    parts = [
        f"done {counts.done + counts.skipped}",
        f"failed {counts.failed}",
        f"running {counts.running}",
        f"queued {counts.queued + counts.pending}",
        f"sub-agents {counts.sub_agents}",
    ]
    if counts.waiting:
        parts.insert(2, f"waiting {counts.waiting}")
    if counts.in_batches or counts.oldest_batch_s is not None:
        oldest = f" (oldest {counts.oldest_batch_s:.0f} s)" if counts.oldest_batch_s else ""
        parts.append(f"in provider batches {counts.in_batches}{oldest}")
    return "  ".join(parts)


def print_summary(rows: Iterable[Mapping[str, Any]], elapsed_s: float, ran: int) -> None:
    """A rich table: tasks per status, tokens, cost, time; then the first failures."""
    from rich.console import Console
    from rich.table import Table

    rows = list(rows)
    by_status = Counter(str(row["status"]) for row in rows)
    tokens = sum(_stat(row, "prompt_tokens") + _stat(row, "completion_tokens") for row in rows)
    cost = sum(_stat(row, "cost_usd") for row in rows)
    table = Table(title="batch summary", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    for status in sorted(by_status):
        table.add_row(status, str(by_status[status]))
    table.add_row("tokens", f"{tokens:,.0f}")
    table.add_row("cost", f"${cost:.4f}")
    table.add_row("this run", f"{ran} in {elapsed_s:.1f} s ({ran / max(elapsed_s, 1e-6):.1f}/s)")
    console = Console()
    console.print(table)
    failures = [row for row in rows if row["status"] != "completed"][:SHOWN_FAILURES]
    for row in failures:
        why = row.get("error") or (f"asks: {row['question']}" if row.get("question") else "")
        line = f"✗ {row['id']} {row['status']}: {_one_line(why)}"
        console.print(printable(line), markup=False, highlight=False)


def _stat(row: Mapping[str, Any], name: str) -> float:
    stats = row.get("stats") or {}
    value = stats.get(name, 0) if isinstance(stats, Mapping) else 0
    return float(value) if isinstance(value, int | float) else 0.0


def _one_line(text: str, limit: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
