"""`fleet`: the command line, composed of the command modules of `fleetops.cli`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from fleet.errors import (
    ConfigError,
    ConversationError,
    FleetError,
    RedisUnreachable,
    TraceNotFound,
)
from fleet.security.redact import install_log_redaction
from fleet.settings import forget_process_settings, process_redactor
from fleetops.cli import batch, demo, metrics, ops, run, serve, traces
from fleetops.cli.output import printable

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

Handler = Callable[[argparse.Namespace], int]


COMMANDS = (run, traces, batch, ops, serve, metrics, demo)
"""Each module adds its own commands; none replaces another's. Celery and the servers are
imported inside the handlers, so `fleet --help` and `fleet run --inline` stay fast."""


def build_parser() -> argparse.ArgumentParser:
    """The parser with every command."""
    parser = argparse.ArgumentParser(prog="fleet", description="Run LLM sub-agents as jobs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, and map errors to one line on stderr and an exit code."""
    # One command, one reading of the environment (tests run many): settings and redactor.
    forget_process_settings()
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    install_log_redaction(process_redactor())  # whatever a command logs, secrets masked
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("fleet: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return reader_gone()
    except RedisUnreachable as exc:
        return fail(with_hint(str(exc)), EXIT_BAD_INPUT)
    except (ConfigError, TraceNotFound, ConversationError) as exc:
        return fail(str(exc), EXIT_BAD_INPUT)
    except FleetError as exc:
        return fail(str(exc), EXIT_FAILED)


def reader_gone() -> int:
    """The reader of stdout left early (`fleet trace list --json | head`): stop quietly.

    stdout goes to /dev/null, so the interpreter's last flush raises nothing either.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_FAILED


def with_hint(message: str) -> str:
    """`message`, and why the command looked where it did when nobody told it where."""
    from fleetops.discovery import no_fleet_hint

    hint = no_fleet_hint()
    return f"{message} ({hint})" if hint else message


def fail(message: str, code: int) -> int:
    """Print `fleet: error: message` (secrets masked, on one safe line); the exit code."""
    print(f"fleet: error: {printable(process_redactor()(message))}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
