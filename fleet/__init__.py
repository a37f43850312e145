"""agent-fleet: LLM sub-agents as jobs.

`fleet` is the runtime (traces, the loop, tools, models); it knows nothing of Celery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Fleet", "InProcessFleet"]

if TYPE_CHECKING:
    from fleet.client import Fleet
    from fleet.inprocess import InProcessFleet


def __getattr__(name: str) -> Any:
    # Lazy so `import fleet` stays cheap and `fleet.models` does not pull in httpx.
    if name == "InProcessFleet":
        from fleet.inprocess import InProcessFleet

        return InProcessFleet
    if name == "Fleet":
        from fleet.client import Fleet

        return Fleet
    raise AttributeError(name)
