"""One model turn, followed call by call: which fleet modules it enters, where it climbs.

`ask_model` (fleet/loop/route.py) runs under `sys.setprofile` in a live in-process run
(scripted model, memory store). Every Python call made inside it whose caller and callee
both live in `fleet/` is recorded: a direct call between two fleet functions (one made
through a stdlib or third-party frame, or a C function, is not a direct call and is not
counted). A *climb* is such a call from a module of one `FLEET_LAYERS` unit into a module
of a unit ranked above it, the same order `layer_violations` in tests/test_imports.py
holds imports to; it is counted once per (caller function, callee function) pair.
docs/architecture.md ("One model turn") lists the modules and climbs measured here.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessFleet
from fleet.loop import route
from fleet.loop.runner import Runner
from fleet.settings import Settings
from fleet.testing import ScriptedModel, text
from tests.test_imports import FLEET_LAYERS, fleet_unit

FLEET = Path(route.__file__).resolve().parent.parent
RANK = {unit: i for i, unit in enumerate(FLEET_LAYERS)}
MODULES_CEILING = 9
"""Fleet modules one live turn enters today, the scripted model's own included (issue 37's
<= 8, and since the cut runs the call in place, issue 40, `llm.cancel`: the call's handle,
instead of a thread hand-over each way): a ceiling that may only go down
(docs/architecture.md, "One model turn", lists them). The turn takes what its run prepared
once (`fleet.loop.call.Prepared`)."""


def fleet_module(code: CodeType) -> str | None:
    """The dotted fleet module a code object was compiled from, or None outside fleet/."""
    path = Path(code.co_filename).resolve()
    if not path.is_relative_to(FLEET):
        return None
    parts = path.relative_to(FLEET.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass
class TurnPath:
    """The direct fleet-to-fleet calls made while `ask_model` ran."""

    calls: set[tuple[str, str, str, str]] = field(default_factory=set)
    """(caller module, caller function, callee module, callee function)."""
    modules: set[str] = field(default_factory=set)
    _depth: int = 0

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if frame.f_code is route.ask_model.__code__:
            self._depth += {"call": 1, "return": -1}.get(event, 0)
            if event == "call":
                self.modules.add("fleet.loop.route")
            return
        if event != "call" or self._depth == 0:
            return
        callee = fleet_module(frame.f_code)
        if callee is None:
            return
        self.modules.add(callee)
        caller_frame = frame.f_back
        caller = None if caller_frame is None else fleet_module(caller_frame.f_code)
        if caller is not None and caller_frame is not None:
            edge = (caller, caller_frame.f_code.co_qualname, callee, frame.f_code.co_qualname)
            self.calls.add(edge)

    def climbs(self) -> list[str]:
        """Each call from a unit into one ranked above it in FLEET_LAYERS."""
        return sorted(
            f"{caller}.{by} -> {callee}.{to}"
            for caller, by, callee, to in self.calls
            if (low := fleet_unit(caller)) is not None
            if (high := fleet_unit(callee)) is not None
            if low != high and RANK[high] > RANK[low]
        )


def one_turn(tmp_path: Path) -> TurnPath:
    """A root run to its one answer, `ask_model` followed while it ran."""
    model = ScriptedModel([text("done")])
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path, env={}), clients={"test": model}
    )
    root = create_root(local.runtime, TaskSpec(task="work", model="test"))
    followed = TurnPath()
    before, before_threads = sys.getprofile(), threading.getprofile()
    sys.setprofile(followed.profile)
    threading.setprofile(followed.profile)  # a thread the turn starts is followed too
    try:
        outcome = Runner(local.runtime).run(root.trace_id).outcome
    finally:
        threading.setprofile(before_threads)
        sys.setprofile(before)
    assert outcome == "completed" and len(model.requests) == 1
    return followed


def test_one_model_turn_enters_few_modules_and_climbs_little(tmp_path: Path) -> None:
    """8 modules at most (issue 37's 8), and no climb at all (under issue 37's 2): a call
    into a higher unit fails here."""
    followed = one_turn(tmp_path)
    report = "\n".join(["modules:", *sorted(followed.modules), "climbs:", *followed.climbs()])
    assert len(followed.modules) <= MODULES_CEILING, report
    assert followed.climbs() == [], report


def test_the_follower_sees_a_climb_and_ignores_code_outside_fleet() -> None:
    # The check itself must be able to fail: a call from storage into the loop climbs.
    followed = TurnPath(
        calls={
            ("fleet.storage.store", "f", "fleet.loop.runner", "g"),
            ("fleet.loop.runner", "g", "fleet.storage.store", "f"),
            ("fleet.loop.route", "h", "fleet.loop.turns", "k"),
        }
    )
    assert followed.climbs() == ["fleet.storage.store.f -> fleet.loop.runner.g"]
    assert fleet_module(threading.Thread.run.__code__) is None
    assert fleet_module(route.decide.__code__) == "fleet.loop.route"
