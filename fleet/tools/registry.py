"""The tool registry: typed functions in, OpenAI schemas and safe execution out.

A tool is a plain function `fn(ctx: ToolContext, ...) -> ToolResult` with type hints and a
Google-style docstring; the JSON schema the model sees is built from those, so the two
cannot drift apart. `execute` is where presets are enforced: a refused, malformed or
failing call becomes an error result for the model, never an exception in the loop.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import operator
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, get_args, get_type_hints

from pydantic import TypeAdapter, ValidationError

from fleet.errors import ConfigError, ToolError
from fleet.llm import cancel
from fleet.presets import AgentPreset
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.schema import json_schema, parse_docstring
from fleet.tools.workspace import truncate

ToolFunction = Callable[..., ToolResult]
"""`fn(ctx: ToolContext, **arguments) -> ToolResult`."""
TOOL_TIMEOUT_GRACE_S = 2.0
"""How long past `tool_timeout_s` a tool that limits itself may take to report it."""

_log = logging.getLogger(__name__)
_REQUIRED: Any = inspect.Parameter.empty


@dataclass(frozen=True)
class _Param:
    name: str
    schema: dict[str, Any]
    default: Any
    nullable: bool
    adapter: TypeAdapter[Any]

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@dataclass(frozen=True)
class ToolSpec:
    """One registered tool."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""
    read_only: bool
    """True when the tool cannot change the workspace."""
    fn: ToolFunction | None
    """None for tools the runner executes itself (`agent`, `evaluate`, `goal`)."""
    params: tuple[_Param, ...] = ()
    bounded: bool = False
    """The tool ends itself within `tool_timeout_s`: it runs in the agent's thread."""
    open_arguments: bool = False
    """`fn(ctx, arguments)` gets the arguments object as sent (an MCP server checks it)."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling form."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}


_NAMES_FOR_MAX = 256


class ToolRegistry:
    """Tools by name, with their schemas; executes calls under a preset."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self._names_for: dict[tuple[Any, ...], tuple[str, ...]] = {}
        """`names_for` by (generation, allowed, denied, read_only, mcp): asked every turn."""
        self.generation = 0
        """Changes whenever the set of tools or a schema does."""

    def register(
        self,
        fn: ToolFunction,
        *,
        name: str | None = None,
        read_only: bool,
        bounded: bool = False,
    ) -> None:
        """Add a typed tool function.

        Args:
            fn: `fn(ctx: ToolContext, ...) -> ToolResult`; every other parameter needs a
                type hint and an entry in the docstring's Args section.
            name: Tool name; defaults to the function's name.
            read_only: Whether the tool leaves the workspace unchanged.
            bounded: The tool ends itself within `ctx.tool_timeout_s` whatever its
                arguments, so it runs in the agent's own thread. Otherwise (the default)
                it runs in a thread of its own that the agent gives up on 2 s past the
                limit, which costs a thread start per call.

        Raises:
            TypeError: The signature or docstring cannot describe a tool.
        """
        tool_name = name if name is not None else str(getattr(fn, "__name__", ""))
        self._check_new(tool_name)
        description, arg_docs = parse_docstring(inspect.getdoc(fn))
        params = _params_of(fn, tool_name, arg_docs)
        parameters = {
            "type": "object",
            "properties": {param.name: param.schema for param in params},
            "required": [param.name for param in params if param.required],
            "additionalProperties": False,
        }
        self._tools[tool_name] = ToolSpec(
            tool_name, description, parameters, read_only, fn, tuple(params), bounded
        )
        self.generation += 1

    def register_schema(
        self, name: str, description: str, parameters: dict[str, Any], read_only: bool
    ) -> None:
        """Add a tool the runner executes itself; only its schema lives here."""
        self._check_new(name)
        if parameters.get("type") != "object":
            raise TypeError(f"tool {name!r}: parameters must be a JSON schema of type 'object'")
        self._tools[name] = ToolSpec(name, description, copy.deepcopy(parameters), read_only, None)
        self.generation += 1

    def replace_group(self, prefix: str, specs: Iterable[ToolSpec]) -> None:
        """Put `specs` in place of every tool whose name starts with `prefix` (MCP servers)."""
        kept = {name: spec for name, spec in self._tools.items() if not name.startswith(prefix)}
        specs = list(specs)
        if not specs and len(kept) == len(self._tools):
            return  # nothing there, nothing to add: cached lists stay valid
        # A new dict, swapped in whole: other threads may be reading the old one.
        self._tools = {**kept, **{spec.name: spec for spec in specs if spec.name not in kept}}
        self.generation += 1

    def names(self) -> list[str]:
        """Every registered tool name, in registration order."""
        return list(self._tools)

    def names_for(self, preset: AgentPreset) -> list[str]:
        """The tools `preset` may call; a read-only preset loses every writing tool."""
        ceiling = (preset.allowed_tools, preset.denied_tools, preset.read_only, preset.mcp_servers)
        key = (self.generation, *ceiling)
        names = self._names_for.get(key)
        if names is None:
            names = tuple(
                spec.name
                for spec in self._tools.values()
                if preset.allows(spec.name) and (spec.read_only or not preset.read_only)
            )
            if len(self._names_for) >= _NAMES_FOR_MAX:  # ceilings read from forged traces
                self._names_for.clear()
            self._names_for[key] = names
        return list(names)

    def get(self, name: str) -> ToolSpec:
        """The spec of tool `name`; unknown names raise `ConfigError`."""
        try:
            return self._tools[name]
        except KeyError:
            raise ConfigError(f"unknown tool {name!r} (known: {', '.join(self._tools)})") from None

    def schemas(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas for `names`, in that order."""
        return [copy.deepcopy(self.get(name).schema()) for name in names]

    def execute(
        self, name: str, arguments: Mapping[str, Any], ctx: ToolContext, preset: AgentPreset
    ) -> ToolResult:
        """Run tool `name` for an agent using `preset`.

        The preset is checked first, then the arguments against the signature. Every
        refusal and failure comes back as a result with `is_error=True`.

        Raises:
            ToolError: Only for a tool the runner must handle itself.
        """
        refusal = self._refusal(name, preset)
        if refusal:
            return _error_result(name, "refused", refusal)
        spec = self._tools[name]
        if spec.fn is None:
            raise ToolError(f"tool {name!r} is handled by the runner")
        if spec.open_arguments and isinstance(arguments, Mapping):
            values, problems = {"arguments": dict(arguments)}, list[str]()
        else:
            values, problems = _bind(spec.params, arguments)
        if problems:
            return _error_result(name, "refused", f"invalid arguments: {'; '.join(problems)}")
        try:
            if spec.bounded:
                result = spec.fn(ctx, **values)
            else:
                result = _call_bounded(name, spec.fn, ctx, values)
        except ToolError as exc:
            return _error_result(name, "failed", str(exc))
        except Exception as exc:  # a tool bug goes back to the model, the loop goes on
            _log.warning("tool %r raised", name, exc_info=True)
            return _error_result(name, "failed", f"{type(exc).__name__}: {exc}")
        if len(result.output) > ctx.output_limit_chars:
            result = replace(result, output=truncate(result.output, ctx.output_limit_chars))
        return result

    def _refusal(self, name: str, preset: AgentPreset) -> str | None:
        if not preset.allows(name):
            return f"tool {name!r} is not allowed for preset {preset.name!r}"
        spec = self._tools.get(name)
        if spec is None:
            return f"unknown tool {name!r} (known: {', '.join(self._tools)})"
        if preset.read_only and not spec.read_only:
            return f"tool {name!r} changes the workspace; preset {preset.name!r} is read-only"
        return None

    def _check_new(self, name: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise TypeError(f"invalid tool name {name!r}")
        if name in self._tools:
            raise TypeError(f"tool {name!r} is already registered")


def built_in() -> tuple[tuple[ToolFunction, bool, bool], ...]:
    """Every built-in tool as (tool, read_only, bounded), imported only now.

    Bounded: workspace file work that ends by itself (capped sizes and entry counts,
    non-blocking opens of regular files only, glob's deadline, grep's child killed at the
    limit) runs without a thread of its own, which cost a tenth of a branch's worker CPU.
    The rest keep the backstop: a shell's grandchildren, DNS lookups and a skill file's
    plain `read_text` (a FIFO blocks it) are outside their own limits. A process that runs
    no agent (`fleet run` submitting to the fleet) never imports the tools.
    """
    from fleet.tools import files, images, search, shell, skills, web
    from fleet.tools.websearch.tool import web_search

    return (
        (files.read_file, True, True),
        (files.list_dir, True, True),
        (images.read_image, True, True),
        (search.glob, True, True),
        (search.grep, True, True),
        (web.web_fetch, True, False),
        (web_search, True, False),
        (skills.skill, True, False),
        (files.write_file, False, True),
        (files.edit_file, False, True),
        (shell.bash, False, False),
    )


def default_registry() -> ToolRegistry:
    """A registry holding every built-in tool."""
    registry = ToolRegistry()
    for fn, read_only, bounded in built_in():
        registry.register(fn, read_only=read_only, bounded=bounded)
    return registry


def _params_of(fn: ToolFunction, name: str, arg_docs: dict[str, str]) -> list[_Param]:
    """The model-facing parameters of `fn`: all but the leading `ctx: ToolContext`."""
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    if not params or hints.get(params[0].name) is not ToolContext:
        raise TypeError(f"tool {name!r}: the first parameter must be `ctx: ToolContext`")
    if hints.get("return") is not ToolResult:
        raise TypeError(f"tool {name!r}: the return type must be ToolResult")
    undocumented = [p.name for p in params[1:] if not arg_docs.get(p.name)]
    unknown = sorted(set(arg_docs) - {p.name for p in params})
    if undocumented or unknown:
        raise TypeError(
            f"tool {name!r}: docstring Args must describe exactly the parameters "
            f"(undocumented: {undocumented}, not parameters: {unknown})"
        )
    return [_param(p, hints, arg_docs[p.name], name) for p in params[1:]]


def _param(p: inspect.Parameter, hints: dict[str, Any], doc: str, tool: str) -> _Param:
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if p.kind not in keyword or p.name not in hints:
        raise TypeError(f"tool {tool!r}: parameter {p.name!r} needs a type hint and a name")
    hint = hints[p.name]
    nullable = hint is Any or type(None) in get_args(hint)
    # An optional argument defaulting to None is simply left out by the model.
    shown = _without_none(hint) if nullable and p.default is None else hint
    schema = {**json_schema(shown), "description": doc}
    if p.default is not _REQUIRED and p.default is not None:
        schema["default"] = p.default
    return _Param(p.name, schema, p.default, nullable, TypeAdapter(hint))


def _without_none(hint: Any) -> Any:
    others = tuple(arg for arg in get_args(hint) if arg is not type(None))
    return functools.reduce(operator.or_, others)


def _bind(
    params: tuple[_Param, ...], arguments: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Validated keyword arguments, and what is wrong with the call."""
    if not isinstance(arguments, Mapping):
        return {}, ["arguments must be a JSON object"]
    known = {param.name for param in params}
    problems = [f"unknown argument {key!r}" for key in arguments if key not in known]
    values: dict[str, Any] = {}
    for param in params:
        value = arguments.get(param.name)
        # Models often send null for an optional argument they mean to leave out.
        left_out = value is None and not param.nullable and not param.required
        if param.name not in arguments or left_out:
            if param.required:
                problems.append(f"missing required argument {param.name!r}")
            continue
        try:
            values[param.name] = param.adapter.validate_python(value)
        except ValidationError as exc:
            reason = "; ".join(error["msg"] for error in exc.errors()[:3])
            problems.append(f"argument {param.name!r}: {reason}")
    return values, problems


def _call_bounded(
    name: str, fn: ToolFunction, ctx: ToolContext, values: dict[str, Any]
) -> ToolResult:
    """`fn(ctx, **values)`, or `ToolError` once `ctx.tool_timeout_s` (plus grace) passed.

    For tools not registered `bounded`: custom tools, and the built-ins whose limits do
    not cover everything they wait on (`bash`, `web_fetch`, `skill`); the backstop that
    lets the agent loop and its worker slot move on. A Python thread cannot be killed: a
    tool stuck in it keeps running in the background until it returns.
    """
    outcome: list[ToolResult | BaseException] = []
    handle = cancel.current()  # the run's, if a stop may cut this call (`fleet.loop.cut`)

    def run() -> None:
        if handle is not None:  # so a stop closes the tool's own HTTP request (web_fetch)
            cancel.bind(handle)
        try:
            outcome.append(fn(ctx, **values))
        except BaseException as exc:  # handed to the caller's thread below
            outcome.append(exc)

    thread = threading.Thread(target=run, name=f"tool:{name}", daemon=True)
    thread.start()
    thread.join(ctx.tool_timeout_s + TOOL_TIMEOUT_GRACE_S)
    if not outcome:
        raise ToolError(f"tool {name!r} did not finish within {ctx.tool_timeout_s:g}s")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _error_result(name: str, outcome: str, message: str) -> ToolResult:
    return ToolResult(title=f"{name} {outcome}", output=message, is_error=True)
