"""`fleet approve` and `fleet deny`: answer a tool call that waits for a person's approval."""

from __future__ import annotations

import argparse

from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.run import connect


def approve(args: argparse.Namespace) -> int:
    """Approve the pending call; a worker runs it and the trace goes on."""
    fleet = connect()
    fleet.approve(args.trace_id, args.approval_id, args.digest)
    print(f"approved: {args.trace_id} runs the call and resumes")
    return ExitCode.OK


def deny(args: argparse.Namespace) -> int:
    """Deny the pending call; the model reads the reason, nothing runs."""
    fleet = connect()
    fleet.deny(args.trace_id, args.reason, args.approval_id, args.digest)
    print(f"denied: {args.trace_id} resumes without the call")
    return ExitCode.OK
