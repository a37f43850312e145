"""`fleet trace show|list`: read traces from the Redis store."""

from __future__ import annotations

import argparse

from fleet.conversation.human import waiting_on, waiting_traces
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.output import (
    approval_lines,
    list_object,
    print_json,
    printable,
    render_tree,
    trace_object,
)
from fleetops.discovery import fleet_settings


def open_store(settings: Settings | None = None) -> TraceStore:
    """The Redis store named by FLEET_REDIS_URL, checked to answer."""
    from fleet.storage.backends.redis.store import RedisStore

    settings = settings or fleet_settings()
    store = RedisStore.from_url(
        settings.redis_url, settings.redis_sentinel_master, cluster=settings.redis_cluster
    )
    store.ping()
    return store


def show_trace(args: argparse.Namespace) -> int:
    """Print one trace tree."""
    store = open_store()
    trace = store.get_trace(args.trace_id)
    if args.json:
        print_json(trace_object(store, trace))
    else:
        print("\n".join(render_tree(store, trace)))
    return ExitCode.OK


def list_traces(args: argparse.Namespace) -> int:
    """Print recent traces, root traces only unless --all."""
    store = open_store()
    if args.waiting:
        rows = waiting_traces(store, args.limit)
    else:
        rows = [t for t in store.list_traces(args.limit * 10) if args.all or not t.parent_trace_id]
    rows = rows[: args.limit]
    if args.json:
        print_json([list_object(t) for t in rows])
    else:
        for t in rows:
            waiting = waiting_on(t) or {}
            question = waiting.get("question")
            text = f"? {question}" if args.waiting and question else t.task
            shown = " ".join(printable(text).split())[:80]
            print(f"{t.trace_id}  {t.status:<9}  {t.mode:<8}  {shown}")
            if args.waiting and waiting.get("kind") == "approval":
                print(approval_lines(t.trace_id, waiting))
    return ExitCode.OK
