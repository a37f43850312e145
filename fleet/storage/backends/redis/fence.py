"""The fence: a write script that first checks the runner still holds its lease.

`RedisStore.fenced` views run every write script behind `FENCE` (`FencedScript.fenced`);
a refusal becomes `LeaseLost` (`lease_lost`).
"""

from __future__ import annotations

import functools

import redis

from fleet.errors import LeaseLost, StopLanded
from fleet.storage.backends.redis import scripts as redis_scripts
from fleet.storage.backends.redis.connect import Lua

# Prepended to a write script for a runner's fenced store: KEYS[1] is the runner's lease and
# ARGV[1] its owner token; both are taken off before the script proper runs. The lease check
# and the write are one atomic step, so a runner whose lease lapsed (a frozen VM, a long GC)
# cannot write into a trace another runner took over, not even in the instant after a check.
FENCE = """
local lease_key = table.remove(KEYS, 1)
local lease_owner = table.remove(ARGV, 1)
if redis.call('GET', lease_key) ~= lease_owner then
  return redis.error_reply('FENCED the lease is not held by this runner')
end
"""

FENCED_PREFIX = "FENCED"
"""The start of the error a fenced script returns when the lease is not the caller's."""
STOPPED_PREFIX = "STOPPED"
"""The start of the error `APPLY` returns for a write refused because of a stop."""


def fenced(script: str) -> str:
    """The script behind the lease check of `FENCE`."""
    return FENCE + script


class FencedScript:
    """A write script registered twice: as it is, and behind the lease check (`fenced`)."""

    def __init__(self, source: str) -> None:
        """Register both forms (loaded into Redis on first use)."""
        self.plain = Lua(source)
        self.fenced = Lua(fenced(source))


@functools.cache
def applying(extension: str | None) -> FencedScript:
    """`APPLY` with this registered write extension (or none), built once per name."""
    return FencedScript(redis_scripts.apply_source(extension))


def lease_lost(trace_id: str, exc: redis.ResponseError) -> Exception:
    """A script's refusal as the fleet's error; any other script error as it is.

    `LeaseLost` for a fenced script's lease check, `StopLanded` for a write refused for a stop.
    """
    if str(exc).startswith(FENCED_PREFIX):
        return LeaseLost(f"the lease of {trace_id!r} is no longer held by this runner")
    if str(exc).startswith(STOPPED_PREFIX):
        return StopLanded(f"a stop was requested for {trace_id!r}: nothing was written")
    return exc
