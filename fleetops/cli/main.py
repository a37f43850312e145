"""`fleet`: the command line. Fleet commands (up, worker, ...) plug in from `fleetops.cli.ops`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from fleet.errors import ConfigError, FleetError, TraceNotFound
from fleet.redact import process_redactor
from fleetops.cli import inline, traces
from fleetops.cli.output import dumps, printable

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The parser with the runtime's commands and every installed plug-in's."""
    parser = argparse.ArgumentParser(prog="fleet", description="Run LLM sub-agents as jobs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inline.register(commands)
    traces.register(commands)
    for plugin in entry_points(group="fleet.commands"):
        plugin.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, and map errors to one line on stderr and an exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("fleet: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConfigError, TraceNotFound) as exc:
        return fail(str(exc), EXIT_BAD_INPUT)
    except FleetError as exc:
        return fail(str(exc), EXIT_FAILED)


def fail(message: str, code: int) -> int:
    """Print `fleet: error: message` (secrets masked, on one safe line); the exit code."""
    print(f"fleet: error: {printable(process_redactor()(message))}", file=sys.stderr)
    return code


def print_json(value: object) -> None:
    """Machine-readable output on stdout, control characters escaped."""
    print(dumps(value))


if __name__ == "__main__":
    sys.exit(main())
