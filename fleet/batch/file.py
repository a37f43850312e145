"""Batch files: JSONL or YAML, every entry validated before anything is submitted.

A batch file holds one task per entry: `task` (required), and optionally `id`, `preset`,
`model`, `workspace`, `metadata`, `budget: {tokens, usd, sub_agents}`, `images: [PATH|URL]`,
`memory: [NAMESPACE]` (the long-term memory its tree may use)
(paths inside the entry's workspace only: a batch file is untrusted), `batch_api` (YAML: a
list, or a `tasks:` list; JSONL: one object per line; a bare string is a task). Problems
read `FILE:LINE: reason`; ids default to `line-N`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from fleet.batch.values import BatchEntry, entry_images, entry_spec
from fleet.batchapi.route import check_route, wants_batch
from fleet.conversation.roots import MAX_BOUND_NAMESPACES, bound_namespaces, check_budget
from fleet.errors import ConfigError, MemoryRefused
from fleet.limits.budget import Budget, BudgetIn
from fleet.runtime import Runtime
from fleet.security import yamlsafe
from fleet.tools.imagesource import MAX_TASK_IMAGES

ENTRY_KEYS = (
    "id",
    "task",
    "preset",
    "model",
    "workspace",
    "metadata",
    "budget",
    "images",
    "batch_api",
    "memory",
    "prompt",
    "variables",
)
YAML_SUFFIXES = frozenset({".yaml", ".yml"})


class BatchInputError(ConfigError):
    """A batch file (or iterable) with problems; nothing was submitted."""

    def __init__(self, where: str, problems: Sequence[tuple[int, str]]) -> None:
        """`problems` are (line, reason) pairs, reported in line order."""
        self.where = where
        self.problems = sorted(problems)
        line, reason = self.problems[0]
        more = len(self.problems) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        super().__init__(f"{where}:{line}: {reason}{suffix}")


class _EntryIn(BaseModel):
    """The wire form of one entry: strict types, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: StrictStr | StrictInt | None = None
    task: StrictStr | None = None
    prompt: StrictStr | None = Field(default=None, min_length=1, max_length=4096)
    """A prompt file inside the entry's workspace, in place of `task`."""
    variables: dict[StrictStr, StrictStr] | None = None
    preset: StrictStr | None = None
    model: StrictStr | None = None
    workspace: StrictStr | None = None
    metadata: dict[str, Any] | None = None
    budget: BudgetIn | None = None
    batch_api: StrictBool | None = None
    images: list[StrictStr] | None = Field(default=None, max_length=MAX_TASK_IMAGES)
    memory: list[StrictStr] | None = Field(default=None, max_length=MAX_BOUND_NAMESPACES)


# -- parsing -----------------------------------------------------------------


def load_entries(path: Path) -> list[BatchEntry]:
    """Read and validate a batch file: YAML by suffix (.yaml/.yml), JSONL otherwise.

    Raises:
        BatchInputError: one or more entries are malformed; the message names the first.
    """
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{where}: cannot read batch file: {reason}") from None
    raw = parse_yaml(text, where) if path.suffix in YAML_SUFFIXES else parse_jsonl(text)
    return build_entries(raw, where)


@dataclass(frozen=True)
class Unreadable:
    """An entry that could not even be parsed; its line is reported with the others."""

    reason: str


def parse_jsonl(text: str) -> list[tuple[int, object]]:
    """(line, value) per non-blank line; a line that is not JSON becomes `Unreadable`."""
    items: list[tuple[int, object]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            items.append((number, Unreadable(f"invalid JSON: {exc.msg} (column {exc.colno})")))
        except RecursionError:  # `[[[[...` a hundred thousand deep: refused, not a traceback
            items.append((number, Unreadable("invalid JSON: nested too deeply")))
    return items


def parse_yaml(text: str, where: str) -> list[tuple[int, object]]:
    """(line, value) per item of a top-level list (or of a `tasks:` list)."""
    loader = yamlsafe.compose(text, where)
    try:
        root = loader.get_single_node()
        if root is not None:
            yamlsafe.check_node(root, where)  # an alias bomb in `metadata` stops here
        items = _yaml_items(root, where)
        return [(node.start_mark.line + 1, loader.construct_document(node)) for node in items]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise BatchInputError(where, [(line, f"invalid YAML: {exc.problem}")]) from None
    finally:
        loader.dispose()


def _yaml_items(root: yaml.Node | None, where: str) -> list[yaml.Node]:
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "tasks":
                root = value
                break
    if not isinstance(root, yaml.SequenceNode):
        line = root.start_mark.line + 1 if root is not None else 1
        raise BatchInputError(where, [(line, "expected a list of tasks (or a 'tasks:' list)")])
    return list(root.value)


def build_entries(items: Iterable[tuple[int, object]], where: str) -> list[BatchEntry]:
    """Validate every item and check ids are unique; all problems at once.

    Raises:
        BatchInputError: naming each bad item's line.
    """
    entries: list[BatchEntry] = []
    problems: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    for line, value in items:
        try:
            entry = parse_entry(value, line)
        except ValueError as exc:
            problems.append((line, str(exc)))
            continue
        if entry.id in first_line:
            problems.append(
                (line, f"duplicate id {entry.id!r} (first on line {first_line[entry.id]})")
            )
            continue
        first_line[entry.id] = line
        entries.append(entry)
    if not entries and not problems:
        problems.append((1, "no tasks in the batch"))
    if problems:
        raise BatchInputError(where, problems)
    return entries


def parse_entry(value: object, line: int) -> BatchEntry:
    """One entry from a mapping (or a bare task string); `ValueError` says what is wrong."""
    if isinstance(value, Unreadable):
        raise ValueError(value.reason)
    if isinstance(value, str):
        value = {"task": value}
    if not isinstance(value, dict):
        raise ValueError(f"expected an object with a 'task', got {type(value).__name__}")
    try:
        wire = _EntryIn.model_validate(value)
    except ValidationError as exc:
        raise ValueError(_reason(exc)) from None
    _check_task(wire)
    entry_id = f"line-{line}" if wire.id is None else str(wire.id)
    if not entry_id.strip():
        raise ValueError("empty id")
    metadata = wire.metadata or {}
    try:
        memory = tuple(bound_namespaces(wire.memory or ()))
    except MemoryRefused as exc:
        raise ValueError(str(exc).removeprefix("--memory: ")) from None
    try:
        json.dumps(metadata)
    except (TypeError, ValueError):
        raise ValueError("metadata must be plain JSON (strings, numbers, lists, objects)") from None
    return BatchEntry(
        id=entry_id,
        task=wire.task or "",
        line=line,
        preset=wire.preset,
        model=wire.model,
        workspace=Path(wire.workspace).expanduser() if wire.workspace else None,
        metadata=metadata,
        budget=wire.budget.to_budget() if wire.budget else None,
        batch_api=wire.batch_api,
        images=tuple(wire.images or ()),
        memory=memory,
        prompt=wire.prompt,
        variables=dict(wire.variables or {}),
    )


def _check_task(wire: _EntryIn) -> None:
    """A task or a prompt file (with its variables), never both; `ValueError` otherwise."""
    if wire.task is None and wire.prompt is None:
        raise ValueError("missing required key 'task' (or 'prompt': a prompt file)")
    if wire.task is not None and wire.prompt is not None:
        raise ValueError("give 'task' or 'prompt' (a prompt file), not both")
    if wire.task is not None and not wire.task.strip():
        raise ValueError("empty task")
    if wire.variables and wire.prompt is None:
        raise ValueError("'variables' go with a 'prompt' file")


def _reason(exc: ValidationError) -> str:
    """The most telling validation error in words (an unknown key explains a missing one)."""
    errors = exc.errors()
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {key!r} (allowed: {', '.join(ENTRY_KEYS)})"
    if error["type"] == "missing":
        return f"missing required key {key!r}"
    return f"{key!r}: {error['msg'].lower()}"


def entries_from(tasks: Iterable[str | Mapping[str, Any] | BatchEntry]) -> list[BatchEntry]:
    """Entries from Python values: task strings, dicts like a file's entries, or entries.

    Positions count from 1 and stand in for line numbers (default ids are `line-N`).

    Raises:
        BatchInputError: naming the position of each bad item (`<batch>:N: reason`).
    """
    items: list[tuple[int, object]] = []
    for position, task in enumerate(tasks, start=1):
        if isinstance(task, BatchEntry):
            items.append((position, _as_dict(task)))
        else:
            items.append((position, dict(task) if isinstance(task, Mapping) else task))
    return build_entries(items, "<batch>")


def _as_dict(entry: BatchEntry) -> dict[str, Any]:
    value: dict[str, Any] = {"id": entry.id, "metadata": dict(entry.metadata)}
    if entry.prompt is None:
        value["task"] = entry.task
    else:
        value |= {"prompt": entry.prompt, "variables": dict(entry.variables)}
    for key in ("preset", "model"):
        if getattr(entry, key) is not None:
            value[key] = getattr(entry, key)
    if entry.workspace is not None:
        value["workspace"] = str(entry.workspace)
    if entry.batch_api is not None:
        value["batch_api"] = entry.batch_api
    if entry.images:
        value["images"] = list(entry.images)
    if entry.memory:
        value["memory"] = list(entry.memory)
    return value


def with_defaults(
    entries: Iterable[BatchEntry],
    *,
    model: str | None = None,
    preset: str | None = None,
    batch_api: bool | None = None,
    workspace: Path | None = None,
) -> list[BatchEntry]:
    """Fill in `model` / `preset` / `batch_api` / `workspace` where an entry names none.

    These are the CLI's flags; an entry's own value wins.
    """
    return [
        replace(
            e,
            model=e.model or model,
            preset=e.preset or preset,
            batch_api=e.batch_api if e.batch_api is not None else batch_api,
            workspace=e.workspace or workspace,
        )
        for e in entries
    ]


# -- checks against the runtime ------------------------------------------------


def check_entries(runtime: Runtime, entries: Sequence[BatchEntry], where: str) -> None:
    """Check presets, models and workspaces as `create_root` would, without creating anything.

    Raises:
        BatchInputError: naming the line of every entry `create_root` would refuse.
    """
    seen: dict[tuple[str, str | None, Path | None, Budget | None, bool | None], str | None] = {}
    problems: list[tuple[int, str]] = []
    for entry in entries:
        try:  # files read now: a refused image or prompt stops the batch before it starts
            model = entry_spec(runtime, entry, {}).model  # a prompt file's model too
            entry_images(runtime, entry)
        except ConfigError as exc:
            problems.append((entry.line, str(exc)))
            continue
        key = (entry.preset or "default", model, entry.workspace, entry.budget, entry.batch_api)
        if key not in seen:
            seen[key] = _check_one(runtime, *key)
        if (reason := seen[key]) is not None:
            problems.append((entry.line, reason))
    if problems:
        raise BatchInputError(where, problems)


def _check_one(
    runtime: Runtime,
    preset: str,
    model: str | None,
    workspace: Path | None,
    budget: Budget | None,
    batch_api: bool | None,
) -> str | None:
    try:
        spec_preset = runtime.preset(preset)
        name = runtime.model_name(model, preset)
        runtime.check_model(name)
        if wants_batch(runtime, batch_api, name):  # refused here, before anything is sent
            check_route(runtime, name)
        runtime.settings.with_workspace(workspace or runtime.settings.workspace)
        check_budget(runtime, name, (budget or Budget()).over(spec_preset.budget))
    except ConfigError as exc:
        return str(exc)
    return None
