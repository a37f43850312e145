"""Usage and success counts: a hook that counts a run's experiences when the run ends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleet.models import Trace
from fleet.observe.hooks import Hooks
from fleet.observe.operator import HookChain, Member

if TYPE_CHECKING:
    from fleet.experiences.store import ExperienceStore
    from fleet.presets import AgentPreset


class ExperienceOutcomes(Hooks):
    """When a trace of a preset that shows experiences ends, count its successes (once)."""

    def __init__(self, store: ExperienceStore, presets: frozenset[str]) -> None:
        """`presets`: the names of the presets that opt in (the others cost nothing)."""
        self.store = store
        self.presets = presets

    def run_finished(self, trace: Trace) -> None:
        """One success for each experience the trace was shown, if it completed."""
        if trace.preset in self.presets:
            self.store.count_outcome(trace.trace_id, trace.status == "completed")


def with_outcomes(
    hooks: Hooks, store: ExperienceStore, presets: Mapping[str, AgentPreset]
) -> Hooks:
    """`hooks` with the outcome counter first, when some preset shows experiences."""
    opted = frozenset(name for name, preset in presets.items() if preset.experiences)
    if not opted:
        return hooks
    return HookChain([Member("experiences", ExperienceOutcomes(store, opted)), Member("", hooks)])
