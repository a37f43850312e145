"""`fleet experience add|list|show|rm|approve`: the rules later runs are shown."""

from __future__ import annotations

import argparse

from fleet.experiences.model import Experience, new_experience
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.output import print_json, printable
from fleetops.cli.run import connect


def add(args: argparse.Namespace) -> int:
    """Add a rule for a scope; approved unless `--proposed` (a person typed it)."""
    fleet = connect()
    experience = new_experience(
        args.scope, args.condition, args.rule, source="manual", approved=not args.proposed
    )
    fleet.experiences.put(experience)
    return _show(experience, args.json)


def list_all(args: argparse.Namespace) -> int:
    """One line per experience (of a scope)."""
    found = connect().experiences.all(args.scope)
    if args.json:
        print_json([e.model_dump(mode="json") for e in found])
        return ExitCode.OK
    for e in found:
        state = "approved" if e.approved else "proposed"
        line = f"{e.id}  {e.scope}  {state}  uses {e.uses}  when {e.condition!r} then {e.rule!r}"
        print(printable(line))
    return ExitCode.OK


def show(args: argparse.Namespace) -> int:
    """One experience with its evidence and counts."""
    return _show(connect().experiences.get(args.experience_id), args.json)


def remove(args: argparse.Namespace) -> int:
    """Forget an experience; exit 2 if there is none."""
    fleet = connect()
    fleet.experiences.get(args.experience_id)  # ExperienceNotFound: one line, exit 2
    fleet.experiences.remove(args.experience_id)
    print(f"removed {args.experience_id}")
    return ExitCode.OK


def approve(args: argparse.Namespace) -> int:
    """Let runs of its scope see a proposed experience."""
    fleet = connect()
    experience = fleet.experiences.get(args.experience_id)
    experience.approved = True
    fleet.experiences.put(experience)
    return _show(experience, args.json)


def _show(experience: Experience, as_json: bool) -> int:
    if as_json:
        print_json(experience.model_dump(mode="json"))
        return ExitCode.OK
    rate = experience.success_rate
    for name, value in (
        ("id", experience.id),
        ("scope", experience.scope),
        ("state", "approved" if experience.approved else "proposed"),
        ("when", experience.condition),
        ("then", experience.rule),
        ("source", experience.source),
        ("evidence", ", ".join(experience.evidence) or "-"),
        ("uses", f"{experience.uses} ({'-' if rate is None else f'{rate:.0%}'} completed)"),
    ):
        print(printable(f"{name}: {value}"))
    return ExitCode.OK


def reflect(args: argparse.Namespace) -> int:
    """Propose experiences from a finished tree; none is shown to a run until approved."""
    proposed = connect().reflect(
        args.trace_id, model=args.model, timeout_s=args.timeout_s, scope=args.scope
    )
    if args.json:
        print_json([e.model_dump(mode="json") for e in proposed])
        return ExitCode.OK
    print(f"{len(proposed)} proposed (approve with `fleet experience approve ID`):")
    for e in proposed:
        print(printable(f"{e.id}  {e.scope}  when {e.condition!r} then {e.rule!r}"))
    return ExitCode.OK
