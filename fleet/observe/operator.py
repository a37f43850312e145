"""The operator's hooks: loaded from `FLEET_HOOKS`, composed, each call guarded.

`FLEET_HOOKS=module:attr,...` names `fleet.Hooks` instances; only the operator's
environment names them (never a workspace file, never a trace), and a module that lies
inside a workspace root is refused before it is imported: an agent could have written it.
Installed packages add theirs through the `fleet.hooks` entry-point group (each entry
`NAME = module:attr`), loaded after FLEET_HOOKS under the same checks, and one more: the
distribution that declares it must be installed outside every workspace root (a
`*.dist-info` an agent wrote into a folder on `sys.path` is refused, not loaded).
Every call of an operator's hook runs in its own thread with a deadline
(`FLEET_HOOK_TIMEOUT_S`): one that raises or overruns is logged and skipped, never kills
the run. `HookBlocked` passes through only where blocking means something
(`tool_started`, `model_requested`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.errors import ConfigError, HookBlocked
from fleet.goals import Goal
from fleet.llm.base import LLMResponse, ToolCall
from fleet.models import Trace
from fleet.observe.hooks import Hooks
from fleet.security.trust import under_roots
from fleet.tools.base import ToolResult

if TYPE_CHECKING:
    from fleet.settings import Settings
    from fleet.storage.store import TraceStore

log = logging.getLogger(__name__)

MAX_CONTEXT_LINES = 20
MAX_CONTEXT_LINE_CHARS = 500
ENTRY_POINT_GROUP = "fleet.hooks"
"""Installed packages' hooks: `[project.entry-points."fleet.hooks"] audit = "acme:AUDIT"`."""


@dataclass(frozen=True)
class Member:
    """One hook of a chain; `timeout_s` None runs it as it is (the fleet's own, OTel)."""

    name: str
    hook: Hooks
    timeout_s: float | None = None


def load_hook(name: str, roots: Sequence[Path], source: str = "FLEET_HOOKS") -> Hooks:
    """The `fleet.Hooks` instance `module:attr` names; `ConfigError` in one line otherwise.

    `source` says where the name came from, first in every error.
    """
    module_name, sep, attr = name.strip().partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{source}: {name!r} is not module:attr")
    _check_origin(name, module_name.split(".")[0], roots, source)
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except Exception as exc:  # whatever the module raises on import is the operator's to see
        raise ConfigError(f"{source}: {name!r} does not load: {type(exc).__name__}") from None
    if not isinstance(found, Hooks):
        kind = type(found).__name__
        raise ConfigError(f"{source}: {name!r} is a {kind}, not a fleet.Hooks instance")
    return found


def _check_origin(name: str, top: str, roots: Sequence[Path], source: str) -> None:
    """Refuse a module that would load from inside a workspace root (or not at all)."""
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: finds, runs nothing
    except ValueError:
        spec = None
    except ImportError as exc:  # the import guard's: its only copy is inside a root
        raise ConfigError(f"{source}: {name!r}: {str(exc).splitlines()[0]}") from None
    if spec is None:
        raise ConfigError(f"{source}: {name!r}: no module {top!r}")
    places = [*(spec.submodule_search_locations or ()), *([spec.origin] if spec.origin else [])]
    for place in places:
        if place not in ("built-in", "frozen") and under_roots(Path(place), roots):
            raise ConfigError(
                f"{source}: {name!r} loads from {place!r}, inside a workspace root where"
                " agents write: install hook modules outside FLEET_WORKSPACE_ROOTS"
            )


def operator_members(names: Sequence[str], roots: Sequence[Path], timeout_s: float) -> list[Member]:
    """The hooks `FLEET_HOOKS` names, then the `fleet.hooks` entry points; each guarded.

    An entry point naming what FLEET_HOOKS names already is not loaded twice.
    """
    members = [Member(n, load_hook(n, roots), timeout_s) for n in names]
    named = {n.strip() for n in names}
    for member in entry_point_members(roots, timeout_s):
        if member.name.partition("=")[2] not in named:
            members.append(member)
    return members


def entry_point_members(
    roots: Sequence[Path], timeout_s: float, found: Iterable[EntryPoint] | None = None
) -> list[Member]:
    """The hooks of the `fleet.hooks` entry points installed (or `found`), by name.

    Each member is named `fleet.hooks:NAME=module:attr` in logs.

    Raises:
        ConfigError: a distribution installed inside a workspace root, or a value that
            does not load (as `load_hook`).
    """
    points = entry_points(group=ENTRY_POINT_GROUP) if found is None else found
    members = []
    for point in sorted(points, key=lambda p: p.name):
        dist = point.dist
        label = f"{ENTRY_POINT_GROUP} entry point {point.name!r}"
        if dist is not None:
            label += f" of {dist.metadata['Name']!r}"
            where = Path(str(dist.locate_file("")))
            if under_roots(where, roots):
                raise ConfigError(
                    f"{label} is installed in {str(where)!r}, inside a workspace root where"
                    " agents write: refused"
                )
        hook = load_hook(point.value, roots, source=label)
        name = f"{ENTRY_POINT_GROUP}:{point.name}={point.value}"
        members.append(Member(name, hook, timeout_s))
    return members


class HookChain(Hooks):
    """Several hooks as one, called in order; operator hooks guarded (see the module)."""

    def __init__(self, members: Sequence[Member]) -> None:
        """`members` in the order their events are delivered."""
        self.members = tuple(members)

    def listens(self, event: str) -> bool:
        """Whether some member listens to `event`."""
        return any(m.hook.listens(event) for m in self.members)

    def _each(self, event: str, *args: Any, may_block: bool = False) -> list[Any]:
        # A member that keeps `Hooks`' no-op for this event is not called (nor its thread
        # started): what it would give is what the chain's callers start from.
        return [_call(m, event, args, may_block) for m in self.members if not _noop(m, event)]

    def run_started(self, trace: Trace) -> None:
        """Each hook's `run_started`, in order."""
        self._each("run_started", trace)

    def run_ended(self, trace: Trace, outcome: str, error: BaseException | None = None) -> None:
        """Each hook's `run_ended`, in order."""
        self._each("run_ended", trace, outcome, error)

    def turn_started(self, trace: Trace, iteration: int) -> None:
        """Each hook's `turn_started`, in order."""
        self._each("turn_started", trace, iteration)

    def turn_ended(self, trace: Trace, iteration: int) -> None:
        """Each hook's `turn_ended`, in order."""
        self._each("turn_ended", trace, iteration)

    def model_requested(self, trace: Trace, model: str, messages: list[dict[str, Any]]) -> None:
        """Each hook's `model_requested`, in order."""
        self._each("model_requested", trace, model, messages, may_block=True)

    def model_responded(self, trace: Trace, response: LLMResponse) -> None:
        """Each hook's `model_responded`, in order."""
        self._each("model_responded", trace, response)

    def model_failed(self, trace: Trace, error: BaseException) -> None:
        """Each hook's `model_failed`, in order."""
        self._each("model_failed", trace, error)

    def tool_started(self, trace: Trace, call: ToolCall) -> None:
        """Each hook's `tool_started`, in order."""
        self._each("tool_started", trace, call, may_block=True)

    def tool_finished(self, trace: Trace, call: ToolCall, result: ToolResult | None) -> None:
        """Each hook's `tool_finished`, in order."""
        self._each("tool_finished", trace, call, result)

    def goal_completed(self, trace: Trace, goal: Goal) -> None:
        """Each hook's `goal_completed`, in order."""
        self._each("goal_completed", trace, goal)

    def child_spawned(self, parent: Trace, child: Trace) -> None:
        """Each hook's `child_spawned`, in order."""
        self._each("child_spawned", parent, child)

    def child_settled(self, parent_trace_id: str, child: Trace) -> None:
        """Each hook's `child_settled`, in order."""
        self._each("child_settled", parent_trace_id, child)

    def messages_delivered(self, trace: Trace, messages: list[dict[str, Any]]) -> None:
        """Each hook's `messages_delivered`, in order."""
        self._each("messages_delivered", trace, messages)

    def context_lines(self, trace: Trace) -> list[str]:
        """Every hook's lines, in order; what is not a string is dropped, long ones cut."""
        lines: list[str] = []
        for got in self._each("context_lines", trace):
            lines += [str(x)[:MAX_CONTEXT_LINE_CHARS] for x in got or () if isinstance(x, str)]
        return lines[:MAX_CONTEXT_LINES]

    def child_context(self, parent: Trace, tool_call_id: str) -> dict[str, str]:
        """Each hook's `child_context`, in order."""
        merged: dict[str, str] = {}
        for got in self._each("child_context", parent, tool_call_id):
            merged |= got if isinstance(got, dict) else {}
        return merged

    def run_finished(self, trace: Trace) -> None:
        """Each hook's `run_finished`, in order."""
        self._each("run_finished", trace)

    def flush(self) -> None:
        """Each hook's `flush`, in order."""
        self._each("flush")


def _noop(member: Member, event: str) -> bool:
    """The member's hook keeps `Hooks`' own no-op method for `event`."""
    return getattr(getattr(member.hook, event), "__func__", None) is getattr(Hooks, event)


def _call(member: Member, event: str, args: tuple[Any, ...], may_block: bool) -> Any:
    """One hook's event; None when it failed or overran (logged), `HookBlocked` if it may."""
    if member.timeout_s is None:
        return getattr(member.hook, event)(*args)
    box: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            box.append((True, getattr(member.hook, event)(*args)))
        except BaseException as exc:  # handed to the calling thread below
            box.append((False, exc))

    # A daemon thread: a hook that never returns is left behind, not waited for at exit.
    thread = threading.Thread(target=target, name=f"hook:{member.name}:{event}", daemon=True)
    thread.start()
    thread.join(member.timeout_s)
    if not box:
        log.warning("hook %r %s overran %.1f s: skipped", member.name, event, member.timeout_s)
        return None
    ok, value = box[0]
    if ok:
        return value
    if isinstance(value, HookBlocked) and may_block:
        raise value
    log.warning("hook %r %s raised %s: skipped", member.name, event, type(value).__name__)
    return None


def build_hooks(settings: Settings, store: TraceStore) -> Hooks:
    """The process's hooks: OTel spans when configured, then the operator's `FLEET_HOOKS`.

    Raises:
        ConfigError: a name in `FLEET_HOOKS` does not load or is not a hook object.
    """
    from fleet.observe.otel import make_hooks

    operator = operator_members(settings.hooks, settings.workspace_roots, settings.hook_timeout_s)
    otel = make_hooks(settings, store)
    if not operator:
        return otel
    return HookChain([Member("otel", otel), *operator])
