"""`fleet memory list|show|set|rm|history|approve NAMESPACE [KEY]`: long-term memory."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleet.memory.model import Entry, Landed, WriteOutcome
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.output import print_json, printable
from fleetops.cli.run import connect


def list_all(args: argparse.Namespace) -> int:
    """The namespaces; with one named, its keys (and how many writes wait for approval)."""
    memory = connect().memory
    if args.namespace is None:
        found = memory.namespaces()
        if args.json:
            print_json(found)
        for namespace in [] if args.json else found:
            print(printable(namespace))
        return ExitCode.OK
    entries, held = memory.entries(args.namespace), memory.proposals(args.namespace)
    if args.json:
        print_json({"entries": [_data(e) for e in entries], "held": len(held)})
        return ExitCode.OK
    for e in entries:
        print(printable(f"{e.key}  v{e.version}  {e.writer}  {_value(e.value, 80)}"))
    if held:
        print(f"{len(held)} held for approval: fleet memory approve {args.namespace}")
    return ExitCode.OK


def show(args: argparse.Namespace) -> int:
    """One key: its value and version (`--json`: the whole entry)."""
    entry = connect().memory.get(args.namespace, args.key)
    if entry is None:
        return _missing(args)
    if args.json:
        print_json(_data(entry))
        return ExitCode.OK
    _print_entry(entry)
    return ExitCode.OK


def set_value(args: argparse.Namespace) -> int:
    """Write a key as the operator; with `--expected-version`, only over that version."""
    try:
        value: Any = json.loads(args.value)
    except json.JSONDecodeError:
        value = args.value  # `fleet memory set user:alice city Tongzhou`
    outcome = connect().memory.set(args.namespace, args.key, value, args.expected_version)
    return _report(args, outcome)


def remove(args: argparse.Namespace) -> int:
    """Forget a key and its history; exit 2 if there was none."""
    if not connect().memory.remove(args.namespace, args.key):
        return _missing(args)
    if args.json:
        print_json({"removed": True})
    else:
        print(printable(f"removed {args.namespace} {args.key}"))
    return ExitCode.OK


def history(args: argparse.Namespace) -> int:
    """A key's kept versions, newest first."""
    found = connect().memory.history(args.namespace, args.key)
    if not found:
        return _missing(args)
    if args.json:
        print_json([_data(e) for e in found])
        return ExitCode.OK
    for e in found:
        line = f"v{e.version}  {e.writer}  {e.source_trace or '-'}  {_value(e.value, 80)}"
        print(printable(line))
    return ExitCode.OK


def approve(args: argparse.Namespace) -> int:
    """Land the recorder's held writes (of one key); a stale one is reported lost."""
    done = connect().memory.approve(args.namespace, args.key)
    rows = [
        {
            "key": a.proposal.key,
            "id": a.proposal.id,
            "landed": isinstance(a.outcome, Landed),
            "version": _version(a.outcome),
        }
        for a in done
    ]
    if args.json:
        print_json(rows)
    for row in [] if args.json else rows:
        state = "landed as" if row["landed"] else "lost: the key is at"
        print(printable(f"{row['key']}  {state} version {row['version']}  ({row['id']})"))
    if not done and not args.json:
        print("nothing held for approval")
    return ExitCode.OK if all(row["landed"] for row in rows) else ExitCode.FAILED


def _report(args: argparse.Namespace, outcome: WriteOutcome) -> int:
    landed = isinstance(outcome, Landed)
    if args.json:
        print_json({"landed": landed, "version": _version(outcome)})
    elif landed:
        print(printable(f"{args.namespace} {args.key}: version {_version(outcome)}"))
    else:
        print(
            printable(
                f"fleet: error: {args.namespace} {args.key} is at version {_version(outcome)},"
                f" not {args.expected_version}: show it and set again"
            ),
            file=sys.stderr,
        )
    return ExitCode.OK if landed else ExitCode.FAILED


def _version(outcome: WriteOutcome) -> int:
    return outcome.version if isinstance(outcome, Landed) else outcome.current_version


def _missing(args: argparse.Namespace) -> int:
    print(printable(f"fleet: error: no key {args.key!r} in {args.namespace}"), file=sys.stderr)
    return ExitCode.BAD_INPUT


def _data(entry: Entry) -> dict[str, Any]:
    return entry.model_dump(mode="json")


def _value(value: Any, width: int) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _print_entry(entry: Entry) -> None:
    for name, shown in (
        ("namespace", entry.namespace),
        ("key", entry.key),
        ("version", str(entry.version)),
        ("writer", entry.writer),
        ("source", entry.source_trace or "-"),
        ("value", json.dumps(entry.value, ensure_ascii=False, indent=2)),
    ):
        print(printable(f"{name}: {shown}"))
