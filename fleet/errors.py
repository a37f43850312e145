"""The one exception family of agent-fleet.

What a retry can fix (`TransientLLMError`) is kept apart from what it cannot.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every error agent-fleet raises on purpose."""


class ConfigError(FleetError):
    """Bad configuration: unknown preset or model, missing key, malformed fleet.yaml."""


class InvalidLimit(ConfigError):
    """A budget or limit that is negative, zero where it means nothing, NaN or infinite."""


class RedisUnreachable(ConfigError):
    """The trace store's Redis did not answer (the message names no password)."""


class BrokerUnavailable(ConfigError):
    """The broker could not be reached or refused a task (the message names no password)."""


class TraceNotFound(FleetError):
    """No trace with this id in the store."""


class TraceExists(FleetError):
    """A trace with this id is in the store already (ids are never reused)."""


class InvalidTraceId(TraceNotFound):
    """A string that cannot be a trace id (outside `[A-Za-z0-9@._-]{1,512}`): nothing is read."""


class TransientLLMError(FleetError):
    """A model call failed in a way a retry may fix (429, 5xx, timeout)."""

    attempts: tuple[dict[str, object], ...] = ()
    """The call's HTTP attempts (`fleet.llm.timing.Attempt.as_dict`), set by the loop that
    made it, so the `queued` event of the hand-back lists them for the trace page."""


class ProviderOverloaded(TransientLLMError):
    """The provider answered 429/503/529: the whole fleet backs off it, this run is handed back.

    Raised at once (no retry in place) when the client's policy hands overloads back.
    """

    def __init__(self, message: str, *, status: int, retry_after_s: float | None) -> None:
        """`retry_after_s`: what the provider asked for (retry-after / retry-after-ms)."""
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class ModelBehaviorError(FleetError):
    """The model answered with something the runtime cannot use."""


class ModelRequestsDisabled(FleetError):
    """A real model client was asked to send while the test guard is on."""


class ToolError(FleetError):
    """A tool refused or failed; the message goes back to the model as the tool result."""


class ConversationError(FleetError):
    """A continue, rewind or reply that does not apply: wrong trace, status or sequence."""


class ContextOverflow(FleetError):
    """The conversation does not fit the model's context window even with outputs elided."""


class LeaseLost(FleetError):
    """A runner's write was refused: its lease lapsed and another runner may own the trace."""


class StopLanded(FleetError):
    """A write made `unless_stopped` was refused whole: the trace's stop flag is raised."""


class NoLiveWorkers(FleetError):
    """No live worker has consumed a queue a trace waits on for too long (it is left as is)."""


class HookBlocked(FleetError):
    """An operator's hook vetoed what was about to happen (a tool call, a model call).

    Raised in `tool_started` the call becomes a refusal the model reads; raised in
    `model_requested` the trace ends `stopped` with `stop_reason: "hook"`.
    """

    def __init__(self, reason: str) -> None:
        """`reason` is shown to the model (tool calls) or stored as the trace's error."""
        super().__init__(reason)
        self.reason = reason


class ExperienceNotFound(FleetError):
    """No experience with this id."""


class MemoryRefused(ConfigError):
    """A memory read or write the fleet refuses: a bad name, a namespace not bound, a cap."""


class NewerRecord(FleetError):
    """A record written for a newer release than this one reads (its `schema_version`)."""
