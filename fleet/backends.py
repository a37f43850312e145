"""The task queue behind `fleet.Fleet`: what it must do, and how one is found."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

from fleet.errors import ConfigError, FleetError
from fleet.limits.trees import Priority
from fleet.models import Mode, Trace
from fleet.runtime import Runtime, SpawnRequest
from fleet.settings import Settings
from fleet.storage.root_message import RootMessage


class Backend(Protocol):
    """What a task queue must do for the client; `workers` provides the Celery one."""

    def enqueue(self, trace: Trace, priority: Priority = "interactive") -> None:
        """Start running this (already persisted) root trace somewhere in the fleet."""
        ...

    def revoke(self, stamps: list[str]) -> None:
        """Drop queued tasks stamped with these values (`fleet.conversation.continuation.stamp`).

        Best effort; the stop flag is the guarantee.
        """
        ...

    def queue(self, mode: Mode) -> str | None:
        """The queue traces of this mode run on (what workers announce they consume).

        None when the backend runs traces without a queue (threads in this process).
        """
        ...


@runtime_checkable
class SendsWithRoot(Protocol):
    """A backend whose root's message can go in the step that queues the root."""

    def root_message(self, priority: Priority = "interactive") -> RootMessage | None:
        """The message of a root about to be queued (`fleet.storage.root_message`).

        None: `enqueue` sends it once the root is queued. When the store did not put it
        (`RootMessage.sent` False), `enqueue` sends it too.
        """
        ...


def load_backend(settings: Settings, name: str = "celery") -> Backend:
    """The backend plug-in registered under `fleet.backends` (installed with agent-fleet)."""
    for plugin in entry_points(group="fleet.backends", name=name):
        factory = plugin.load()
        backend: Backend = factory(settings)
        return backend
    raise ConfigError(f"no fleet backend {name!r} installed (reinstall agent-fleet)")


class RunsNoAgents:
    """A fleet client's dispatcher: the workers run every agent and dispatch its children."""

    children_survive_restart = True

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        """Never called: a client runs no agent."""
        raise FleetError("a fleet client runs no agent: its workers dispatch children")
