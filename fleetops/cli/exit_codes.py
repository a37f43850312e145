"""The `fleet` command's exit codes: one enum, so every command means the same by each."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a `fleet` command's exit status says (the table in docs/operations.md)."""

    OK = 0
    """Done; for a run, the trace completed."""
    FAILED = 1
    """The trace (or a batch entry) failed or was stopped, or the command's work did."""
    BAD_INPUT = 2
    """Nothing was done: bad input or configuration, an unknown trace, Redis unreachable."""
    NO_WORKERS = 2
    """`fleet run`/`wait`: no live worker consumed a queue the tree needs (the trace is left
    as it is). The same status as BAD_INPUT: the fleet could not take the work."""
    WAITING = 3
    """The trace waits on a person (`fleet reply`) or an approval (`fleet approve`)."""
    INTERRUPTED = 130
    """Ctrl-C: 128 + SIGINT, as a shell reports it."""
