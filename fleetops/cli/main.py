"""`fleet`: parse with `fleetops.cli.commands`, then import and run the command's handler.

Nothing here or in `commands` imports more than argparse before the arguments parsed:
`fleet --help` and a mistyped option answer at the speed of a bare interpreter.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import NoReturn

from fleetops.cli.commands import build_parser
from fleetops.cli.exit_codes import ExitCode

__all__ = ["build_parser", "main"]


Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, and map errors to one line on stderr and an exit code."""
    args = build_parser().parse_args(argv)
    if (check := getattr(args, "check", None)) is not None:
        check(args)  # what argparse cannot say alone, still before any import
    from fleet.hidden_imports import import_redis_without_metrics_sdk

    import_redis_without_metrics_sdk()
    handler = resolve(args.handler)
    return run(handler, args)


def resolve(target: str) -> Handler:
    """The handler a "module:function" string names (imported only now, after parsing)."""
    module, _, function = target.partition(":")
    handler: Handler = getattr(importlib.import_module(module), function)
    return handler


def run(handler: Handler, args: argparse.Namespace) -> int:
    """Call `handler` with this command's settings and log redaction; errors as one line."""
    from fleet.errors import (
        ConfigError,
        ConversationError,
        ExperienceNotFound,
        FleetError,
        NoLiveWorkers,
        RedisUnreachable,
        TraceNotFound,
    )
    from fleet.security.redact import install_log_redaction
    from fleet.settings import forget_process_settings, process_redactor

    # One command, one reading of the environment (tests run many): settings and redactor.
    forget_process_settings()
    if (discovery := sys.modules.get("fleetops.discovery")) is not None:
        discovery.forget_where()  # tests run many commands in one process
    install_log_redaction(process_redactor())  # whatever a command logs, secrets masked
    try:
        code = handler(args)
    except KeyboardInterrupt:
        print("fleet: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return reader_gone()
    except RedisUnreachable as exc:
        return fail(with_hint(str(exc)), ExitCode.BAD_INPUT)
    except (ConfigError, TraceNotFound, ExperienceNotFound, ConversationError) as exc:
        return fail(str(exc), ExitCode.BAD_INPUT)
    except NoLiveWorkers as exc:  # e.g. the default Redis, where no fleet runs
        return fail(str(exc), ExitCode.NO_WORKERS)
    except FleetError as exc:
        return fail(str(exc), ExitCode.FAILED)
    if (discovery := sys.modules.get("fleetops.discovery")) is not None:
        discovery.say_where()  # only a command that looked for a fleet imported it
    return code


def reader_gone() -> int:
    """The reader of stdout left early (`fleet trace list --json | head`): stop quietly.

    stdout goes to /dev/null, so the interpreter's last flush raises nothing either.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ExitCode.FAILED


def with_hint(message: str) -> str:
    """`message`, and why the command looked where it did when nobody told it where."""
    from fleetops.discovery import no_fleet_hint

    hint = no_fleet_hint()
    return f"{message} ({hint})" if hint else message


def fail(message: str, code: int) -> int:
    """Print `fleet: error: message` (secrets masked, on one safe line); the exit code."""
    from fleet.settings import process_redactor
    from fleetops.cli.output import printable

    print(f"fleet: error: {printable(process_redactor()(message))}", file=sys.stderr)
    return code


def entry() -> NoReturn:
    """The `fleet` command: `main`, then a quick exit (`leave`)."""
    leave(main())


def leave(code: int) -> NoReturn:
    """Exit with `code`, skipping the interpreter's tear-down when nothing needs it.

    The exit handlers run (log handlers and any OpenTelemetry exporter flush there) and the
    output is flushed; what is skipped is the collection of every module and object, ~70 ms
    of `fleet run`'s wall time. A thread still working (not a daemon) gets the normal exit,
    which waits for it.
    """
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    ):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
