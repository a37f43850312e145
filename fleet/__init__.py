"""agent-fleet: LLM sub-agents as jobs.

`fleet` is the runtime (traces, the loop, tools, models); it knows nothing of Celery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["AsyncFleet", "Fleet", "HookBlocked", "Hooks", "InProcessFleet"]

if TYPE_CHECKING:
    from fleet.aio.client import AsyncFleet
    from fleet.client import Fleet
    from fleet.errors import HookBlocked
    from fleet.inprocess import InProcessFleet
    from fleet.observe.hooks import Hooks


def __getattr__(name: str) -> Any:
    # Lazy so `import fleet` stays cheap and `fleet.models` does not pull in httpx.
    if name == "InProcessFleet":
        from fleet.inprocess import InProcessFleet

        return InProcessFleet
    if name == "AsyncFleet":
        from fleet.aio.client import AsyncFleet

        return AsyncFleet
    if name == "Fleet":
        from fleet.client import Fleet

        return Fleet
    if name == "HookBlocked":
        from fleet.errors import HookBlocked

        return HookBlocked
    if name == "Hooks":  # what an operator's FLEET_HOOKS object subclasses
        from fleet.observe.hooks import Hooks

        return Hooks
    raise AttributeError(name)
