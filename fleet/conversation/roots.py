"""Root traces: a task checked (preset, model, workspace) and persisted `queued`.

Both `fleet.inprocess.InProcessFleet` and the remote `fleet.client.Fleet` create roots here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fleet import ids, lifecycle
from fleet.batchapi.route import check_route
from fleet.config.limits import PositiveCount, validated
from fleet.conversation.fanout import fan_out_plan
from fleet.errors import ConfigError, MemoryRefused, ToolError
from fleet.ids import check_memory_namespace
from fleet.limits.budget import FINAL_SHARE, NO_BUDGET, Budget
from fleet.limits.gate import DEFAULT_OUTPUT_BOOKING
from fleet.limits.trees import DEFAULT_SCHEDULE, Priority, Schedule
from fleet.models import Mode, Trace
from fleet.runstate import RunState
from fleet.runtime import Runtime
from fleet.storage.store import Serving
from fleet.storage.watchdog import check_served
from fleet.tools.imagecheck import Image, stored_ref

MAX_BOUND_NAMESPACES = 8
"""Namespaces one tree may be bound to."""


@dataclass(frozen=True)
class TaskSpec:
    """One task to run as a root trace."""

    task: str
    model: str | None = None
    preset: str = "default"
    workspace: Path | None = None
    mode: Mode = "main"
    metadata: Mapping[str, Any] | None = None
    """The caller's own data, kept on the trace as it is: the fleet never reads it."""
    budget: Budget | None = None
    """What the whole tree may spend; the preset's budget fills what it leaves open."""
    max_concurrent: int | None = None
    """Children of the tree running at once (else the preset's, else unbounded)."""
    priority: Priority = "interactive"
    """`batch` trees are served after `interactive` ones."""
    images: tuple[Image, ...] = ()
    """Shown to the model with the task (`fleet.tools.imagesource.load_images` checks them)."""
    fan_out: tuple[str, ...] | None = None
    """A fan-out root: explores these tasks itself, no model deciding (`fanout`)."""
    fan_out_preset: str = "explore"
    """The preset of a fan-out root's branches (read-only whatever it says)."""
    memory: tuple[str, ...] = ()
    """Long-term memory namespaces the tree may use (`user:alice`); children inherit them."""
    system: str | None = None
    """Added to the root's system prompt after its preset's (a prompt file's `$system$`)."""
    temperature: float | None = None
    """The root's sampling temperature (a prompt file's), where its preset sets none."""
    batch_api: bool = False
    """Every model call of the tree goes through the providers' Batch APIs."""
    batch_key: str | None = None
    """The batch file run this root belongs to (`fleet.batch`), with `batch_entry`."""
    batch_entry: str | None = None
    human_timeout_s: int | None = None
    """How long this tree's waits on a person last (else the fleet's `human_timeout_s`)."""

    def run_state(self) -> RunState:
        """The root's run state, from these typed options alone (never from `metadata`).

        Raises:
            ConfigError: a fan-out with no task or an empty one; a timeout below 1 s.
        """
        if self.human_timeout_s is not None and self.human_timeout_s < 1:
            raise ConfigError(f"human_timeout_s must be at least 1, got {self.human_timeout_s}")
        plan = None if self.fan_out is None else fan_out_plan(self.fan_out, self.fan_out_preset)
        return RunState(
            fan_out=plan,
            batch_api=self.batch_api,
            batch=self.batch_key,
            batch_entry=self.batch_entry,
            human_timeout_s=self.human_timeout_s,
        )


def create_root(runtime: Runtime, spec: TaskSpec, serving: Serving | None = None) -> Trace:
    """Validate the spec (preset, model, workspace) and persist a queued root trace.

    `serving`: the queue that must serve it (`TraceStore.queue_root` checks it in the same
    step as the writes).

    Raises:
        ConfigError: Unknown preset or model, missing API key, bad workspace, a workspace
            no live worker of `serving.queue` accepts.
    """
    if not spec.task.strip():
        raise ConfigError("the task is empty")
    run = spec.run_state()
    if spec.fan_out is not None:
        runtime.preset(spec.fan_out_preset)
    runtime.preset(spec.preset)
    model = runtime.model_name(spec.model, spec.preset)
    runtime.check_model(model)
    if spec.batch_api:  # a provider without a Batch API is refused here, in one line
        check_route(runtime, model)
    workspace = runtime.settings.with_workspace(spec.workspace or runtime.settings.workspace)
    if spec.images and not runtime.has_vision(model):
        raise ConfigError(f"model {model!r} takes no images (vision: false in fleet.yaml)")
    check_temperature(runtime, spec)
    budget, schedule = _controls(runtime, spec, model)
    memory = bound_namespaces(spec.memory)
    if serving is not None and (spec.images or budget or schedule):  # written before the root
        check_served(runtime.store, serving.queue, serving.workspace)
        serving = None
    trace_id = ids.root_id()
    # Stored once for the tree before its root exists; the trace names them, never holds them.
    try:
        refs = [stored_ref(runtime.images, trace_id, image) for image in spec.images]
    except ToolError as exc:
        raise ConfigError(f"image refused: {exc}") from None
    trace = Trace(
        trace_id=trace_id,
        root_trace_id=trace_id,
        mode=spec.mode,
        task=spec.task,
        name="main",
        preset=spec.preset,
        model=_portable(model),
        workspace=str(workspace.workspace),
        metadata=dict(spec.metadata or {}),
        run=run.model_copy(
            update={"scheduled": schedule is not None, "budgeted": budget is not None}
        ),
        context=_context(spec, refs),
        memory=memory,
    )
    if budget is not None:
        assert runtime.gate.budgets is not None, "checked by _controls"
        runtime.gate.budgets.create(trace_id, budget)
    if schedule is not None and runtime.trees is not None:
        runtime.trees.create(trace_id, schedule)
    return lifecycle.queue_root(runtime, trace, serving, listed=True)


def _context(spec: TaskSpec, refs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the root's first messages and model calls read besides its task."""
    out: dict[str, Any] = {"images": refs} if refs else {}
    if spec.system:
        out["system"] = spec.system
    if spec.temperature is not None:
        out["temperature"] = spec.temperature
    return out


def check_temperature(runtime: Runtime, spec: TaskSpec) -> None:
    """`ConfigError` for a temperature the preset does not allow.

    A preset that sets its temperature runs at that one only; any other takes 0..2.
    """
    asked = spec.temperature
    if asked is None:
        return
    if not 0.0 <= asked <= 2.0:
        raise ConfigError(f"temperature {asked}: give a number from 0 to 2")
    fixed = runtime.preset(spec.preset).temperature
    if fixed is not None and asked != fixed:
        raise ConfigError(
            f"temperature {asked}: preset {spec.preset!r} runs at temperature {fixed} only"
        )


def bound_namespaces(namespaces: Sequence[str]) -> list[str]:
    """The submitter's namespaces, checked and without repeats; `MemoryRefused` names one."""
    if len(namespaces) > MAX_BOUND_NAMESPACES:
        raise MemoryRefused(f"memory: at most {MAX_BOUND_NAMESPACES} namespaces per tree")
    return list(dict.fromkeys(check_memory_namespace(ns, "--memory") for ns in namespaces))


def _controls(
    runtime: Runtime, spec: TaskSpec, model: str
) -> tuple[Budget | None, Schedule | None]:
    """The tree's budget and schedule to write before its root exists (workers see them).

    Checked, not written; None for what the tree does not need written.
    """
    preset = runtime.preset(spec.preset)
    budget = (spec.budget or NO_BUDGET).over(preset.budget)
    if spec.max_concurrent is not None:  # the Python API too, not only the CLI's flag
        validated(_Width, {"max_concurrent": spec.max_concurrent})
    schedule = Schedule(spec.max_concurrent or preset.max_concurrent, spec.priority)
    if not budget.empty:
        if runtime.gate.budgets is None:
            raise ConfigError("budgets need the Redis store: run through the fleet")
        check_budget(runtime, model, budget)
    written = schedule != DEFAULT_SCHEDULE and runtime.trees is not None
    return (None if budget.empty else budget), (schedule if written else None)


class _Width(BaseModel):
    """How wide a tree may run, checked by the limits' one set of rules."""

    max_concurrent: PositiveCount


def check_budget(runtime: Runtime, model: str, budget: Budget) -> None:
    """Refuse a budget that cannot pay for a single model call of `model`.

    Every call books its longest answer (`max_output_tokens`, else the default booking)
    and a tenth of the budget is set aside for the root's last turn, so a smaller budget
    would admit no call: the tree would end at once with no answer. Only that lower bound
    is checked here; the prompt's own tokens are booked per call on the worker.

    Raises:
        ConfigError: naming the budget, what one call books, and the way out.
    """
    booking = runtime.gate.max_output_tokens(model) or DEFAULT_OUTPUT_BOOKING
    usable = 1 - FINAL_SHARE
    if budget.tokens is not None and budget.tokens * usable < booking:
        need = math.ceil(booking / usable)
        raise ConfigError(
            f"budget tokens {budget.tokens} cannot pay for one call of {model!r}: each call"
            f" books its longest answer ({booking} tokens) and a tenth is kept for the last"
            f" turn; give at least {need}, or set max_output_tokens on the model in fleet.yaml"
        )
    cost = runtime.gate.cost(model, 0, booking)
    if budget.usd is not None and cost > 0 and budget.usd * usable < cost:
        raise ConfigError(
            f"budget usd {budget.usd} cannot pay for one call of {model!r}: its longest answer"
            f" ({booking} tokens) books ${cost:.4f} and a tenth is kept for the last turn;"
            f" give at least ${cost / usable:.4f}, or set max_output_tokens in fleet.yaml"
        )


def _portable(model: str) -> str:
    """`scripted:rel.yaml` becomes absolute so a worker in another directory finds it.

    `scripted:example` stays: every worker finds the bundled example in its own package.
    """
    if model.startswith("scripted:") and model != "scripted:example":
        return "scripted:" + str(Path(model.removeprefix("scripted:")).expanduser().resolve())
    return model
