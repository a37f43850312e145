"""`fleet run` (through the fleet), `fleet watch` and `fleet stop`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleet.client import Fleet, Handle
from fleet.conversation.prompts import parse_vars
from fleet.errors import (
    BrokerUnavailable,
    ConfigError,
    ConversationError,
    InvalidLimit,
    NoLiveWorkers,
)
from fleet.limits.budget import Budget
from fleet.models import Event
from fleet.storage.backends.redis.connect import redact_url
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.inline import check_run_arguments, run_inline
from fleetops.cli.interrupt import Interrupt, interrupt_flag, keyboard_interrupt
from fleetops.cli.output import printable, report
from fleetops.discovery import fleet_settings

BUDGET_FLAGS = ("tokens", "usd", "sub_agents", "wall_s")
"""The `Budget` fields `fleet run` takes as `--budget-<field>`."""


def budget_of(args: argparse.Namespace) -> Budget | None:
    """The budget the command line asked for, if any.

    Raises:
        InvalidLimit: naming the flag, e.g. `--budget-usd: must be greater than 0 (got -5.0)`.
    """
    values = {name: getattr(args, f"budget_{name}") for name in BUDGET_FLAGS}
    try:
        budget = Budget(**values)
    except InvalidLimit as exc:
        field = str(exc).removeprefix("budget.").partition(":")[0]
        flag = "--budget-" + field.replace("_", "-")
        raise InvalidLimit(f"{flag}{str(exc).removeprefix('budget.' + field)}") from None
    return None if budget.empty else budget


def connect() -> Fleet:
    """A fleet client, checked to reach Redis."""
    return Fleet.from_env(fleet_settings())


def run(args: argparse.Namespace) -> int:
    """Submit (or continue), stream progress to stderr, print the answer (or --json).

    From here on Ctrl-C and SIGTERM only set a flag (see `fleetops.cli.interrupt`): a
    signal before the submission submits nothing, one after it stops the tree; either
    way the command exits 130 (143 for SIGTERM) with one line.
    """
    budget = budget_of(args)  # bad input is refused before anything is reached
    if args.inline:
        if budget or args.max_concurrent:
            raise ConfigError("--budget-* and --max-concurrent need the fleet (drop --inline)")
        return run_inline(args)
    check_run_arguments(args)
    if args.continue_id and (budget or args.max_concurrent):
        raise ConfigError("--continue keeps the tree's budget and --max-concurrent")
    with interrupt_flag() as interrupt:
        fleet = connect()
        require_workers(fleet, "fleet.main")
        if interrupt.is_set():
            print("fleet: interrupted: nothing submitted", file=sys.stderr)
            return interrupt.exit_code
        handle = start(fleet, args)
        code = follow(fleet, handle, args.timeout_s, interrupt)
        if interrupt.is_set():
            fleet.stop(handle.trace_id)  # a second Ctrl-C meanwhile only sets the flag again
            print(f"interrupted: stopped {handle.trace_id}", file=sys.stderr)
            return interrupt.exit_code
    if code is not None:
        return code
    return report(fleet.store, fleet.trace(handle.trace_id), as_json=args.json)


def start(fleet: Fleet, args: argparse.Namespace) -> Handle:
    """Continue the trace `--continue` names, else submit a new root; say which."""
    if args.regenerate:
        handle = fleet.regenerate(args.continue_id, args.after_sequence)
        print(f"regenerating {handle.trace_id} from {args.after_sequence}", file=sys.stderr)
        return handle
    if args.continue_id:
        handle = fleet.continue_trace(args.continue_id, args.task, args.after_sequence)
        print(f"continued {handle.trace_id}", file=sys.stderr)
        return handle
    handle = fleet.submit(
        args.task,
        prompt=args.prompt,
        variables=parse_vars(args.var),
        model=args.model,
        preset=args.preset,
        workspace=args.workspace,
        human_timeout_s=args.human_timeout_s,
        budget=budget_of(args),
        max_concurrent=args.max_concurrent,
        images=args.image,
        memory=args.memory,
    )
    print(f"submitted {handle.trace_id}", file=sys.stderr, flush=True)
    return handle


def follow(
    fleet: Fleet, handle: Handle, timeout_s: float | None, interrupt: Interrupt
) -> int | None:
    """Show the tree's progress until it ends or `interrupt` is set; an exit code if it failed.

    None when there is a trace to report (it ended, or the interrupt came first).
    """
    try:
        events = handle.events(timeout_s, cancel=interrupt.event)
        waiting = show_progress(events, handle.trace_id, Asker(fleet, interrupt=interrupt))
        if waiting not in (None, handle.trace_id):  # a sub-agent's: the root waits on it
            return ExitCode.WAITING
    except TimeoutError as exc:
        print(f"fleet: error: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    except NoLiveWorkers as exc:  # the trace stays as it is: a worker started later resumes it
        print(f"fleet: error: {exc}", file=sys.stderr)
        return ExitCode.NO_WORKERS
    return None


def require_workers(fleet: Fleet, queue: str) -> None:
    """`ConfigError` unless some worker consumes `queue` (a clear error beats a hang).

    Worker heartbeats in Redis answer in one read; the Celery broadcast (a second's wait
    for replies) is asked only when they name no consumer (a worker of an older version).
    """
    from kombu.exceptions import OperationalError

    from workers.backend import CeleryBackend

    if not isinstance(fleet.backend, CeleryBackend) or fleet.store.live_consumers(queue):
        return
    broker = redact_url(fleet.backend.app.conf.broker_url)
    try:
        replies = fleet.backend.app.control.inspect(timeout=1.0).active_queues() or {}
    except OperationalError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise BrokerUnavailable(f"cannot reach the broker at {broker!r}: {reason}") from None
    if not any(q.get("name") == queue for queues in replies.values() for q in queues):
        raise ConfigError(
            f"no worker consumes queue {queue!r} on {broker!r} (start one with `fleet up`"
            " or `fleet worker`, or point FLEET_REDIS_URL at a running fleet)"
        )


def show_progress(events: Iterable[Event], root: str, asker: Asker | None = None) -> str | None:
    """One line per sub-agent start and finish, on stderr; questions go to `asker`.

    Returns the id of a trace left waiting for an answer or an approval nobody here can
    give, if any.
    """
    for event in events:
        line = progress_line(event, root)
        if line:
            print(printable(line), file=sys.stderr, flush=True)
        if asker is None or not _is_question(event, root):
            continue
        if event.data.get("type") == "approval":
            if not asker.approve(event.trace_id, Shown.of(event.data)):
                return event.trace_id  # nobody here can approve it: the run ends (exit 3)
        elif not asker.ask(root, str(event.data.get("question", ""))):
            return root  # nobody here can answer it: the run ends (exit 3), the tree waits
    return None


def _is_question(event: Event, root: str) -> bool:
    """A question to the root's person, or a call of any trace of the tree to approve."""
    kind = event.data.get("type")
    return (
        event.kind == "collaborator"
        and event.status == "waiting"
        and (kind == "approval" or (kind == "human" and event.trace_id == root))
    )


class Asker:
    """Answers a question on a terminal (then the run goes on), else says how to answer it."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        interactive: bool | None = None,
        interrupt: Interrupt | None = None,
    ) -> None:
        """`interactive` defaults to whether stdin is a terminal.

        Ctrl-C at the prompt sets `interrupt` (the run then stops the tree).
        """
        self.fleet = fleet
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.interrupt = interrupt or Interrupt()

    def ask(self, trace_id: str, question: str) -> bool:
        """Prompt for the reply and send it; False off a terminal (`fleet reply` answers)."""
        hint = f"waiting for `fleet reply {trace_id} ANSWER`"
        if self.interrupt.is_set():
            return True  # the run is stopping the tree: nobody waits for this answer
        if not self.interactive:
            print(hint, file=sys.stderr, flush=True)
            return False
        try:
            with keyboard_interrupt(self.interrupt):
                answer = ""
                while not answer.strip():
                    answer = input("reply> ")
        except KeyboardInterrupt:  # the flag is set too: the run stops the tree
            print(file=sys.stderr)
            return True
        except EOFError:
            print(f"\n{hint}", file=sys.stderr, flush=True)
            return False
        try:
            self.fleet.reply(trace_id, answer)
        except ConversationError as exc:  # answered elsewhere meanwhile
            print(f"fleet: {exc}", file=sys.stderr, flush=True)
        return True

    def approve(self, trace_id: str, shown: Shown) -> bool:
        """Show the whole call, prompt y/n and answer it; False off a terminal.

        The answer carries the call's id and the digest of the call shown: one that is
        not the call waiting is refused (`fleet.conversation.approval`).
        """
        digest = f" --digest {shown.digest}" if shown.digest else ""
        hint = f"waiting for `fleet approve {trace_id}{digest}` or `fleet deny {trace_id} REASON`"
        if self.interrupt.is_set():
            return True
        print(printable(shown.text), file=sys.stderr, flush=True)
        if not self.interactive:
            print(hint, file=sys.stderr, flush=True)
            return False
        try:
            with keyboard_interrupt(self.interrupt):
                answer = ""
                while answer not in ("y", "n"):
                    answer = input("approve? [y/n] ").strip().lower()[:1]
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return True
        except EOFError:
            print(f"\n{hint}", file=sys.stderr, flush=True)
            return False
        try:
            if answer == "y":
                self.fleet.approve(trace_id, shown.call_id, shown.digest)  # exactly as shown
            else:
                self.fleet.deny(trace_id, "denied at the terminal", shown.call_id, shown.digest)
        except ConversationError as exc:  # answered elsewhere meanwhile
            print(f"fleet: {exc}", file=sys.stderr, flush=True)
        return True


@dataclass(frozen=True)
class Shown:
    """A waiting approval as its event tells it: the call as shown, its id and digest."""

    text: str
    call_id: str | None
    digest: str | None

    @classmethod
    def of(cls, data: dict[str, Any]) -> Shown:
        """From a `{type: approval, status: waiting}` collaborator event's data."""
        call_id, digest = data.get("tool_call_id"), data.get("digest")
        text = str(data.get("shown") or data.get("tool") or "")
        if digest:
            text += f"\n  digest: {digest}"
        return cls(
            "\n".join(f"  {line}" for line in text.splitlines()),
            str(call_id) if call_id else None,
            str(digest) if digest else None,
        )


def progress_line(event: Event, root: str) -> str | None:
    """A human line for the events worth showing, else None."""
    name = event.data.get("name") or event.trace_id.rsplit("@", 1)[-1]
    if event.data.get("type") in ("human", "approval") and event.status == "waiting":
        return f"? {event.data.get('question', '')}"
    if event.kind == "collaborator" and event.status == "queued":
        return f"  + {name} started ({event.trace_id})"
    if event.kind == "finish" and event.trace_id != root:
        return f"  {'✓' if event.status == 'completed' else '✗'} {name} {event.status}"
    if event.kind == "trace" and event.trace_id == root:
        return f"[{event.status}] {root}"
    if event.kind == "finish":
        return f"[{event.status}] {root}"
    return None


def watch(args: argparse.Namespace) -> int:
    """Follow a trace tree until it finishes: a live tree on a terminal, else plain lines."""
    from fleetops.watch_view import watch_trace

    fleet = connect()
    fleet.trace(args.trace_id)
    try:
        final = watch_trace(fleet, args.trace_id, args.timeout_s, live=sys.stdout.isatty())
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except TimeoutError as exc:
        print(f"fleet: error: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    print(f"{final.trace_id} {final.status}")
    return ExitCode.OK if final.status == "completed" else ExitCode.FAILED


def reply(args: argparse.Namespace) -> int:
    """Answer a waiting trace; any worker resumes it."""
    fleet = connect()
    fleet.reply(args.trace_id, args.answer)
    print(f"replied: {args.trace_id} resumes")
    return ExitCode.OK


def send(args: argparse.Namespace) -> int:
    """Send a message to a running trace."""
    fleet = connect()
    entry_id = fleet.send(args.trace_id, args.text, sender=args.sender, interrupt=args.interrupt)
    how = "now (interrupting its model call)" if args.interrupt else "before its next model call"
    print(f"sent {entry_id} to {args.trace_id}: it reads it {how}")
    return ExitCode.OK


def compact(args: argparse.Namespace) -> int:
    """Compact a finished root now (`fleet.loop.compact`): one model call, in this process."""
    done = connect().compact(args.trace_id)
    print(
        f"compacted {args.trace_id}: messages {done.first_sequence}..{done.last_sequence}"
        f" summarised in {done.summary_sequence} (about {done.tokens_before} -> "
        f"{done.tokens_after} tokens); the originals stay (--after-sequence N goes back)"
    )
    return ExitCode.OK


def stop(args: argparse.Namespace) -> int:
    """Stop a trace and its subtree."""
    fleet = connect()
    fleet.trace(args.trace_id)
    ids = fleet.stop(args.trace_id)
    print(f"stopping {len(ids)} trace(s) under {args.trace_id}")
    return ExitCode.OK
