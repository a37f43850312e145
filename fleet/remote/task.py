"""A remote agent's task as the fleet keeps it, and its errors: values, no HTTP client.

Apart from `fleet.remote.wire` (a2a-sdk and httpx), so that a worker, whose loop decides
what a remote child does (`fleet.remote.decide`), starts without importing them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.errors import FleetError

TERMINAL = frozenset({"completed", "failed", "canceled", "rejected"})
"""The remote task states that end it."""


class RemoteError(FleetError):
    """A remote agent could not be reached or answered wrongly; the message is one line."""


class RemoteRefused(RemoteError):
    """Nothing a retry fixes: the address is refused, the answer too large or forged."""


@dataclass(frozen=True)
class RemoteTask:
    """A remote task as the fleet keeps it: ids, state and capped text."""

    task_id: str
    context_id: str
    state: str
    """submitted | working | input-required | completed | failed | canceled | rejected |
    auth-required | unknown."""
    message: str = ""
    """The status message's text (a question when input-required)."""
    artifact: str = ""
    """Every artifact's text parts, joined and capped."""
