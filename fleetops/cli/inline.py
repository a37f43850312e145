"""`fleet run --inline`: a whole agent tree in this process, no Celery, no network."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from fleet.api import LocalFleet
from fleet.settings import Settings
from fleetops.cli.output import report


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by inline and fleet runs."""
    parser.add_argument("task", help="what the main agent should do")
    parser.add_argument("--inline", action="store_true", help="run in this process")
    parser.add_argument("--model", help="provider:model, an alias, or scripted:FILE.yaml")
    parser.add_argument("--preset", default="default", help="agent preset (default: default)")
    parser.add_argument(
        "--workspace", type=Path, help="workspace root (default: FLEET_WORKSPACE or .)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--timeout-s", type=float, default=None, help="give up waiting after this long"
    )


def run_inline(args: argparse.Namespace) -> int:
    """Run the task in-process and print the answer (or the JSON object)."""
    settings = Settings.from_env()
    if args.workspace is not None or "FLEET_WORKSPACE" in os.environ:
        settings = settings.with_workspace(args.workspace or settings.workspace)
    local = LocalFleet.from_settings(settings, redis=bool(os.environ.get("FLEET_REDIS_URL")))
    trace = local.run(args.task, model=args.model, preset=args.preset)
    return report(local.store, trace, as_json=args.json)
