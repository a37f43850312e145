"""The scripted model: a deterministic LLMClient that never touches the network.

`ScriptedModel` is either a queue of responses or a function of the conversation (like
pydantic-ai's FunctionModel). From a YAML file (`scripted:FILE.yaml`) it is a *stateless*
function of the conversation, so every worker process answers a trace the same way and a
resumed trace picks up where it stopped. `scripted:FILE.yaml` models (demos, tests; only
with FLEET_ALLOW_SCRIPTED=1) load here; `fleet.testing` re-exports it for tests and users.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleet.errors import ConfigError, ModelBehaviorError
from fleet.llm.base import LLMResponse, ToolCall, Usage
from fleet.llm.cancel import pause
from fleet.security import yamlsafe

__all__ = [
    "EXAMPLE_NAME",
    "EXAMPLE_SCRIPT",
    "Script",
    "ScriptedModel",
    "call",
    "calls",
    "script_file",
    "text",
]

EXAMPLE_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "explore.yaml"
"""The bundled demo explore (`fleet demo`, `fleet up`'s hint): inside the package, so an
installed wheel has it as a checkout does."""
EXAMPLE_NAME = "example"
"""`scripted:example` names EXAMPLE_SCRIPT: the README's commands work as printed, from any
directory, in a checkout or an installed wheel."""


def script_file(name: str) -> Path:
    """The file of `scripted:NAME`: the bundled example for `example`, else the path."""
    return EXAMPLE_SCRIPT if name == EXAMPLE_NAME else Path(name)


ModelFunction = Callable[[list[dict[str, Any]], list[dict[str, Any]]], LLMResponse]


def text(content: str) -> LLMResponse:
    """A final answer."""
    return LLMResponse(content=content, usage=_usage(content), model="scripted")


def call(name: str, call_id: str | None = None, **arguments: Any) -> LLMResponse:
    """A response that asks for one tool call."""
    return calls((name, arguments), call_id=call_id)


def calls(*items: tuple[str, dict[str, Any]], call_id: str | None = None) -> LLMResponse:
    """A response that asks for several tool calls in one turn."""
    stamp = call_id or f"call_{next(_ids)}"
    tool_calls = tuple(
        ToolCall(id=f"{stamp}_{i}" if len(items) > 1 else stamp, name=n, arguments=json.dumps(a))
        for i, (n, a) in enumerate(items)
    )
    body = json.dumps([c.arguments for c in tool_calls])
    return LLMResponse(content=None, tool_calls=tool_calls, usage=_usage(body), model="scripted")


class _Counter:
    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def __next__(self) -> int:
        with self._lock:
            self._n += 1
            return self._n


_ids = _Counter()


def _usage(body: str) -> Usage:
    return Usage(prompt_tokens=10, completion_tokens=max(1, len(body) // 4))


class ScriptedModel:
    """An LLMClient that answers from a script; never touches the network."""

    holds_no_connection = True
    """A cut call of it has nothing to close (`fleet.llm.base.LLMClient`)."""
    ends_on_cancel: bool
    """Its latency waits on the call's cancel handle: a cut ends the call at once. Not for
    a `function` given by code (it may block): only a script's, or a list of answers."""

    def __init__(
        self,
        responses: Iterable[LLMResponse | str] = (),
        *,
        function: ModelFunction | None = None,
        latency_ms: int = 0,
        jitter_ms: int = 0,
        keep: int | None = None,
    ) -> None:
        """Answer from `responses` in order, or from `function(messages, tools)`.

        Each answer takes `latency_ms` plus up to `jitter_ms` more (uniformly random), as
        real models vary. `requests` and `tools_seen` keep the last `keep` calls (all of
        them by default, for a test's assertions; none for a model loaded from a file,
        which a long-lived worker may ask millions of times).
        """
        if keep is not None and keep < 0:
            raise ValueError(f"keep must be None or at least 0, not {keep}")
        self._queue: deque[LLMResponse] = deque(
            text(r) if isinstance(r, str) else r for r in responses
        )
        self._function = function
        self.ends_on_cancel = function is None
        self._latency_ms = latency_ms
        self._jitter_ms = jitter_ms
        self._lock = threading.Lock()
        self._keep = keep
        self.requests: list[list[dict[str, Any]]] = []
        """The conversations this model was sent (the last `keep`), for assertions."""
        self.tools_seen: list[list[dict[str, Any]]] = []
        """The tool schemas offered with each of those requests."""
        self.cache_keys: list[str | None] = []
        """The `cache_key` of each of those requests."""

    @classmethod
    def from_file(cls, path: Path) -> ScriptedModel:
        """Load a YAML script (see `examples/explore.yaml` for the format)."""
        # The path comes from a trace, so errors name where, never what: a YAML error's
        # text quotes the line it failed on, which could be a line of a credentials file.
        try:
            # libyaml's loader when PyYAML has it: a 1000-branch script parses in 2 ms, not
            # 38, inside the runtime's client lock that every thread of a worker waits on.
            text = path.read_text(encoding="utf-8")
            data = yamlsafe.load(text, f"scripted model {str(path)!r}")
        except OSError as exc:
            raise ConfigError(f"scripted model {str(path)!r}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"scripted model {str(path)!r}: not UTF-8 text") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"scripted model {str(path)!r}: invalid YAML{where}") from None
        script = Script.parse(data, str(path))
        model = cls(
            function=script.respond,
            latency_ms=script.latency_ms,
            jitter_ms=script.jitter_ms,
            keep=0,
        )
        model.ends_on_cancel = True  # a script answers at once, but for its latency
        return model

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        cache_key: str | None = None,
    ) -> LLMResponse:
        """Return the next scripted response."""
        with self._lock:
            self._record(messages, tools, cache_key)
            response = self._next(messages, tools)
        if self._latency_ms or self._jitter_ms:
            pause((self._latency_ms + random.random() * self._jitter_ms) / 1000)
        return response

    def _record(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], cache_key: str | None
    ) -> None:
        if self._keep == 0:
            return
        self.requests.append([dict(m) for m in messages])
        self.tools_seen.append([dict(t) for t in tools])
        self.cache_keys.append(cache_key)
        if self._keep is not None and len(self.requests) > self._keep:
            del self.requests[0], self.tools_seen[0], self.cache_keys[0]

    def _next(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if self._function is not None:
            return self._function(messages, tools)
        if not self._queue:
            raise ModelBehaviorError("scripted model has no responses left")
        return self._queue.popleft()


@dataclass(frozen=True)
class _Step:
    raw: dict[str, Any]
    calls: tuple[tuple[str, str], ...] | None
    """Each tool call's name and arguments JSON, and (last) all the arguments as JSON, for
    the usage: the same every turn, so encoded once. None when an argument is no JSON (a
    YAML date): the call fails as it always did, when the step is used."""

    @classmethod
    def of(cls, raw: dict[str, Any]) -> _Step:
        try:
            calls = _encoded_calls(raw)
        except (TypeError, ValueError):
            return cls(raw, None)
        return cls(raw, calls)


def _encoded_calls(step: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The step's tool calls as (name, arguments JSON), then ("", every arguments' JSON)."""
    calls = [
        (c["name"], json.dumps(c.get("arguments") or {})) for c in step.get("tool_calls") or []
    ]
    return (*calls, ("", json.dumps([arguments for _, arguments in calls])))


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    steps: tuple[_Step, ...]


@dataclass(frozen=True)
class Script:
    """A YAML script: the first rule whose `match` regex finds the task answers.

    The step used is the number of assistant messages already in the conversation, so the
    script is a pure function of the conversation. Past the last step it repeats the last.
    A step is `content`, `tool_calls` (each `name` + `arguments`), or `raise` (a failing
    model call, for tests of failure handling). `content` is filled in (`{task}`, `{turn}`,
    `{last_tool}`, `{last_user}`, `{memory}`); a step with `fill: true` fills in the string
    values of its tool calls' arguments too, so a call can carry what the prompt held.
    """

    rules: tuple[_Rule, ...]
    latency_ms: int = 0
    jitter_ms: int = 0

    @classmethod
    def parse(cls, data: object, where: str) -> Script:
        """Validate the YAML structure, naming what is wrong and where."""
        if not isinstance(data, dict) or not isinstance(data.get("scripts"), list):
            raise ConfigError(f"{where}: expected a mapping with a 'scripts' list")
        rules = []
        for i, raw in enumerate(data["scripts"]):
            if not isinstance(raw, dict) or not isinstance(raw.get("steps"), list):
                raise ConfigError(f"{where}: scripts[{i}] needs a 'steps' list")
            try:
                pattern = re.compile(str(raw.get("match", ".*")), re.S)
            except re.error as exc:
                raise ConfigError(f"{where}: scripts[{i}].match: {exc}") from None
            if not raw["steps"]:
                raise ConfigError(f"{where}: scripts[{i}].steps is empty")
            for j, step in enumerate(raw["steps"]):
                _check_step(step, f"{where}: scripts[{i}].steps[{j}]")
            rules.append(_Rule(pattern, tuple(_Step.of(step) for step in raw["steps"])))
        latency_ms, jitter_ms = data.get("latency_ms", 0), data.get("jitter_ms", 0)
        for name, value in (("latency_ms", latency_ms), ("jitter_ms", jitter_ms)):
            if not isinstance(value, int):
                raise ConfigError(f"{where}: {name} must be an integer")
        return cls(tuple(rules), latency_ms, jitter_ms)

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        """The response for this conversation."""
        task = next((_text(m["content"]) for m in messages if m["role"] == "user"), "")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        for rule in self.rules:
            if rule.pattern.search(task):
                step = rule.steps[min(turn, len(rule.steps) - 1)]
                return _render(step, task, turn, messages)
        raise ModelBehaviorError(f"no script matches task {task[:60]!r}")


def _check_step(step: object, where: str) -> None:
    if not isinstance(step, dict) or not ({"content", "tool_calls", "raise"} & step.keys()):
        raise ConfigError(f"{where}: a step needs 'content', 'tool_calls' or 'raise'")
    for call_ in step.get("tool_calls") or []:
        if not isinstance(call_, dict) or not isinstance(call_.get("name"), str):
            raise ConfigError(f"{where}: each tool call needs a 'name'")


def _render(step: _Step, task: str, turn: int, messages: list[dict[str, Any]]) -> LLMResponse:
    raw = step.raw
    if "raise" in raw:
        raise ModelBehaviorError(f"scripted failure: {raw['raise']}")
    fill = _Fill(task, turn, messages)
    if raw.get("fill") is True:
        raw = {**raw, "tool_calls": [_filled(c, fill) for c in raw.get("tool_calls") or []]}
        step = _Step.of(raw)
    *calls, (_, arguments) = step.calls if step.calls is not None else _encoded_calls(raw)
    tool_calls = tuple(
        ToolCall(id=f"call_{turn}_{i}", name=name, arguments=arguments_json)
        for i, (name, arguments_json) in enumerate(calls)
    )
    content = raw.get("content")
    if content is not None:
        content = str(content).format_map(fill)
    body = (content or "") + arguments
    return LLMResponse(content=content, tool_calls=tool_calls, usage=_usage(body), model="scripted")


def _filled(tool_call: dict[str, Any], fill: _Fill) -> dict[str, Any]:
    """A tool call whose string arguments (at any depth) have their fields filled in."""

    def filled(value: Any) -> Any:
        if isinstance(value, str):
            return value.format_map(fill)
        if isinstance(value, list):
            return [filled(v) for v in value]
        if isinstance(value, dict):
            return {k: filled(v) for k, v in value.items()}
        return value

    return {**tool_call, "arguments": filled(tool_call.get("arguments") or {})}


MEMORY_HEADING = "## Memory"


class _Fill(dict[str, Any]):
    """A step's template fields; `last_tool`, `last_user`, `memory` are read only if used.

    `memory`: the entries of the system prompt's `## Memory` block (its `- ` lines, joined
    by `; `), what a real model reads there; "" without one.
    """

    def __init__(self, task: str, turn: int, messages: list[dict[str, Any]]) -> None:
        super().__init__(task=task, turn=turn)
        self._messages = messages

    def __missing__(self, key: str) -> str:
        if key == "memory":
            self[key] = value = _memory_lines(self._messages)
            return value
        role = {"last_tool": "tool", "last_user": "user"}.get(key)
        if role is None:
            return "{" + key + "}"
        found = (_text(m["content"]) for m in reversed(self._messages) if m["role"] == role)
        self[key] = value = next(found, "")
        return value


def _memory_lines(messages: list[dict[str, Any]]) -> str:
    system = "\n".join(_text(m["content"]) for m in messages if m["role"] == "system")
    _, heading, rest = system.partition(f"\n{MEMORY_HEADING}\n")
    if not heading and system.startswith(f"{MEMORY_HEADING}\n"):
        rest = system[len(MEMORY_HEADING) + 1 :]
    found: list[str] = []
    for line in rest.splitlines():
        if line.startswith("#") or (found and not line.startswith("- ")):
            break
        if line.startswith("- "):
            found.append(line[2:])
    return "; ".join(found)


def _text(content: Any) -> str:
    """A message's text: its text parts when it is a list (an image is not matched on)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return str(content)
