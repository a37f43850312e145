"""What `POST /api/traces` and `POST /api/traces/{id}/run` take, checked field by field.

The bodies are `fleet run`'s options as JSON (pydantic at the edge: unknown fields, wrong
types and out-of-range numbers are refused with the field's name). Then every check that
`Fleet.submit` would make runs here, before anything is written, each refusal naming its
field (`FieldError`; the handler answers 422): the preset, the model (known, key present),
the workspace (under the roots; served by a live worker), the budget (valid, able to pay
for one call), the memory namespaces, the images (paths confined to the workspace, like a
batch entry's; URLs through the SSRF guard). No HTTP here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.conversation.fanout import fan_out_task
from fleet.conversation.roots import MAX_BOUND_NAMESPACES, TaskSpec, bound_namespaces, check_budget
from fleet.errors import ConfigError, FleetError, InvalidLimit
from fleet.experiences.reflect import MAX_FOCUS_CHARS
from fleet.limits.budget import Budget
from fleet.limits.trees import Priority
from fleet.models import Mode
from fleet.storage.watchdog import check_served
from fleet.tools.imagesource import MAX_TASK_IMAGES, load_images

if TYPE_CHECKING:
    from fleet.client import Fleet

MAX_TASK_CHARS = 32_000
"""The longest task or message taken (a body is capped at 64 KiB anyway)."""
MAX_EXPLORE_TASKS = 64
MAX_NAME_CHARS = 300


class FieldError(FleetError):
    """A body the API refuses: `field` names where (`budget.tokens`), the message says why."""

    def __init__(self, field: str, message: str) -> None:
        """`field` dotted (`budget.tokens`), empty for the body as a whole."""
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class Body(BaseModel):
    """A request body: no unknown field, no type coerced (`"5"` is no number)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


B = TypeVar("B", bound=Body)
T = TypeVar("T")


class BudgetBody(Body):
    """`budget`: what the whole tree may spend (`fleet run --budget-*`)."""

    tokens: int | None = None
    usd: float | None = None
    sub_agents: int | None = None
    depth: int | None = None
    wall_s: float | None = None


class SubmitBody(Body):
    """`POST /api/traces`: a root, as `fleet run` takes it (`task`) or an explore (`explore`)."""

    task: str | None = Field(default=None, min_length=1, max_length=MAX_TASK_CHARS)
    explore: list[str] | None = Field(default=None, min_length=1, max_length=MAX_EXPLORE_TASKS)
    preset: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    model: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    workspace: str | None = Field(default=None, min_length=1, max_length=4096)
    mode: Literal["main", "delegate", "explore", "evaluate"] = "main"
    budget: BudgetBody | None = None
    max_concurrent: int | None = Field(default=None, gt=0, le=100_000)
    priority: Literal["interactive", "batch"] = "interactive"
    images: list[str] = Field(default_factory=list, max_length=MAX_TASK_IMAGES)
    memory: list[str] = Field(default_factory=list, max_length=MAX_BOUND_NAMESPACES)
    metadata: dict[str, Any] | None = None
    human_timeout_s: int | None = Field(default=None, gt=0, le=30 * 86_400)


class RunMessage(Body):
    """One message of `POST /api/traces/{id}/run`: a user turn."""

    role: Literal["user"]
    content: str = Field(min_length=1, max_length=MAX_TASK_CHARS)


class RunBody(Body):
    """`POST /api/traces/{id}/run`: continue, rewind (`after_sequence`), or regenerate.

    Regenerate: `after_sequence` and no message.
    """

    messages: list[RunMessage] = Field(default_factory=list, max_length=1)
    after_sequence: int | None = Field(default=None, ge=0)


class ReflectBody(Body):
    """`POST /api/traces/{id}/reflect`: what to look at, where proposals go, which model."""

    focus: str | None = Field(default=None, min_length=1, max_length=MAX_FOCUS_CHARS)
    scope: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    model: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)


class CompactBody(Body):
    """`POST /api/traces/{id}/compact`: no fields (`{}`)."""


def parsed(kind: type[B], raw: bytes) -> B:
    """The body as `kind`; `FieldError` naming the first field that does not fit.

    An empty body is `{}`. A body that is not JSON at all has the field `body`.
    """
    try:
        return kind.model_validate_json(raw.strip() or b"{}")
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        if error["type"] == "json_invalid":
            raise FieldError("body", "not JSON") from None
        field = ".".join(str(part) for part in error["loc"]) or "body"
        raise FieldError(field, str(error["msg"])[:200]) from None


@dataclass(frozen=True)
class Submission:
    """A checked `SubmitBody`: what `Fleet.submit_spec` is handed."""

    spec: TaskSpec
    budget: Budget | None
    max_concurrent: int | None
    priority: Priority


def _field(field: str, check: Callable[..., T], *args: Any) -> T:
    """`check(*args)`, its `ConfigError` (or `InvalidLimit`) as a `FieldError` on `field`."""
    try:
        return check(*args)
    except ConfigError as exc:
        raise FieldError(field, str(exc)) from None


def checked(fleet: Fleet, body: SubmitBody) -> Submission:
    """The body checked as `Fleet.submit` would, every refusal a `FieldError`; nothing written."""
    if (body.task is None) == (body.explore is None):
        raise FieldError("task", "give either task (a string) or explore (a list of tasks)")
    runtime = fleet.runtime
    preset = body.preset or ("explore" if body.explore is not None else "default")
    _field("preset", runtime.preset, preset)
    root_preset = "default" if body.explore is not None else preset
    model = _field("model", runtime.model_name, body.model, root_preset)
    _field("model", runtime.check_model, model)
    workspace = _workspace(fleet, body, root_preset)
    budget = _budget(fleet, body.budget, model)
    memory = tuple(_field("memory", bound_namespaces, body.memory))
    metadata = dict(body.metadata or {})  # the caller's alone: the fleet reads none of it
    spec = replace(
        _spec(body, preset, workspace, memory, metadata), human_timeout_s=body.human_timeout_s
    )
    if body.images:
        if not runtime.has_vision(model):
            raise FieldError("images", f"model {model!r} takes no images (vision: false)")
        settings = runtime.settings.with_workspace(workspace)
        loaded = _field(
            "images",
            lambda: load_images(
                body.images,
                workspace=settings.workspace,
                web_allow=settings.web_allow,
                private=settings.private_dirs,
            ),
        )
        spec = replace(spec, images=loaded)
    return Submission(spec, budget, body.max_concurrent, body.priority)


def _spec(
    body: SubmitBody,
    preset: str,
    workspace: Path,
    memory: tuple[str, ...],
    metadata: dict[str, Any],
) -> TaskSpec:
    mode: Mode = body.mode
    if body.explore is not None:
        tasks = tuple(body.explore)
        if not all(t.strip() for t in tasks):
            raise FieldError("explore", "every task must be a non-empty string")
        return TaskSpec(
            fan_out_task(tasks),
            body.model,
            "default",
            workspace,
            metadata=metadata,
            fan_out=tasks,
            fan_out_preset=preset,
            memory=memory,
        )
    assert body.task is not None
    if not body.task.strip():
        raise FieldError("task", "the task is empty")
    return TaskSpec(body.task, body.model, preset, workspace, mode, metadata, memory=memory)


def _workspace(fleet: Fleet, body: SubmitBody, preset: str) -> Path:
    """The workspace (the fleet's default when none is given), under the roots and served."""
    settings = fleet.runtime.settings
    asked = Path(body.workspace) if body.workspace is not None else settings.workspace
    chosen = _field("workspace", settings.with_workspace, asked).workspace
    queue = fleet.backend.queue(body.mode)
    _field("workspace", check_served, fleet.store, queue, chosen)
    return Path(chosen)


def _budget(fleet: Fleet, body: BudgetBody | None, model: str) -> Budget | None:
    if body is None:
        return None
    try:
        budget = Budget(**body.model_dump())
    except InvalidLimit as exc:  # "budget.tokens: must be greater than 0 (got -5)"
        field, _, why = str(exc).partition(":")
        raise FieldError(field.strip(), why.strip()) from None
    if budget.empty:
        return None
    _field("budget", check_budget, fleet.runtime, model, budget)
    return budget
