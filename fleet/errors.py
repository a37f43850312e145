"""The one exception family of agent-fleet.

What a retry can fix (`TransientLLMError`) is kept apart from what it cannot.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every error agent-fleet raises on purpose."""


class ConfigError(FleetError):
    """Bad configuration: unknown preset or model, missing key, malformed fleet.yaml."""


class TraceNotFound(FleetError):
    """No trace with this id in the store."""


class TransientLLMError(FleetError):
    """A model call failed in a way a retry may fix (429, 5xx, timeout)."""


class ModelBehaviorError(FleetError):
    """The model answered with something the runtime cannot use."""


class ModelRequestsDisabled(FleetError):
    """A real model client was asked to send while the test guard is on."""


class ToolError(FleetError):
    """A tool refused or failed; the message goes back to the model as the tool result."""


class BudgetExceeded(FleetError):
    """A run went over its token or cost budget."""


class LeaseLost(FleetError):
    """A runner's write was refused: its lease lapsed and another runner may own the trace."""


class NoLiveWorkers(FleetError):
    """No live worker has consumed a queue a trace waits on for too long (it is left as is)."""
