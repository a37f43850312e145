"""Prompt files: a task written once with `%variables%`, run with values given each time.

The seeds' `.prompt` format (`fleet run --prompt task.prompt --var name=value`,
`Fleet.submit(prompt=Path, variables={...})`, a batch entry's `prompt:`):

    ---
    model: openai:gpt-4o-mini     # optional: the default model (--model still wins)
    temperature: 0.3              # optional: within what the preset allows
    ---
    $system$
    You review code for %team%.
    $user$
    Review %file% for thread safety.

The front matter is optional and takes only `model`, `temperature` and `description`;
without sections the whole body is the task. `$system$` text is added to the trace's system
prompt after the preset's. `%name%` is replaced once (a value holding `%x%` is not expanded
again); a variable the file names and nobody gave, or one given that the file never names,
is a one-line error naming the file. The file is untrusted input: at most
`MAX_PROMPT_BYTES`, UTF-8, its YAML bounded (`fleet.security.yamlsafe`); a batch entry's
path is confined to the entry's workspace as its images are.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.conversation.roots import TaskSpec
from fleet.errors import ConfigError, ToolError
from fleet.presets.frontmatter import describe, parse_yaml, split
from fleet.tools.safe_open import open_file

MAX_PROMPT_BYTES = 256 * 1024
MAX_VARIABLES = 64
MAX_VALUE_CHARS = 32_000
VARIABLE = re.compile(r"%([A-Za-z_][A-Za-z0-9_]{0,63})%")
SECTION = re.compile(r"^\$(system|user)\$[ \t]*$", re.M)


class PromptFront(BaseModel):
    """A prompt file's front matter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(default=None, min_length=1, max_length=300)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    description: str | None = Field(default=None, max_length=2000)


@dataclass(frozen=True)
class Prompt:
    """A prompt file with its variables filled in: what a root is submitted with."""

    user: str
    system: str | None = None
    model: str | None = None
    temperature: float | None = None


def load_prompt(
    path: Path,
    variables: Mapping[str, str] | None = None,
    *,
    workspace: Path | None = None,
    private: tuple[Path, ...] = (),
) -> Prompt:
    """Read, parse and fill in the prompt file; `ConfigError` names the file and the fault.

    With `workspace`, `path` is relative to it and may not leave it (a batch entry's);
    without, it is the caller's own file.
    """
    where = str(path)
    text = _read(path, workspace, private)
    return render(text, dict(variables or {}), where)


def _read(path: Path, workspace: Path | None, private: tuple[Path, ...]) -> str:
    try:
        if workspace is not None:
            opened = open_file(workspace, str(path), os.O_RDONLY, private=private)
            with os.fdopen(opened.fd, "rb") as file:
                raw = file.read(MAX_PROMPT_BYTES + 1)
        else:
            with path.expanduser().open("rb") as file:
                raw = file.read(MAX_PROMPT_BYTES + 1)
    except ToolError as exc:
        raise ConfigError(f"prompt {str(path)!r}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"prompt {str(path)!r}: {exc.strerror or type(exc).__name__}") from None
    if len(raw) > MAX_PROMPT_BYTES:
        raise ConfigError(f"prompt {str(path)!r} is over {MAX_PROMPT_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"prompt {str(path)!r} is not UTF-8 text") from None


def render(text: str, variables: dict[str, str], where: str) -> Prompt:
    """The prompt in `text` (a file's content) with `variables` filled in."""
    front = PromptFront()
    body = text.removeprefix("\ufeff")
    if body.startswith("---"):
        try:
            header, body = split(body)
            front = PromptFront.model_validate(parse_yaml(header))
        except ConfigError as exc:
            raise ConfigError(f"prompt {where!r}: {exc}") from None
        except ValidationError as exc:
            raise ConfigError(f"prompt {where!r}: {describe(exc.errors()[0])}") from None
    system, user = _sections(body, where)
    _check_variables(variables, [system or "", user], where)
    filled = [_fill(part, variables) if part is not None else None for part in (system, user)]
    if not (filled[1] or "").strip():
        raise ConfigError(f"prompt {where!r}: the $user$ part is empty")
    return Prompt(filled[1] or "", filled[0], front.model, front.temperature)


def _sections(body: str, where: str) -> tuple[str | None, str]:
    """The `$system$` and `$user$` texts (no sections: all of it is the user's)."""
    marks = list(SECTION.finditer(body))
    if not marks:
        return None, body.strip()
    if body[: marks[0].start()].strip():
        raise ConfigError(f"prompt {where!r}: text before the first $system$/$user$ line")
    parts: dict[str, str] = {}
    for index, mark in enumerate(marks):
        end = marks[index + 1].start() if index + 1 < len(marks) else len(body)
        name = mark.group(1)
        if name in parts:
            raise ConfigError(f"prompt {where!r}: ${name}$ appears twice")
        parts[name] = body[mark.end() : end].strip()
    return parts.get("system"), parts.get("user", "")


def _check_variables(given: dict[str, str], parts: Sequence[str], where: str) -> None:
    named = {m.group(1) for part in parts for m in VARIABLE.finditer(part)}
    missing = sorted(named - set(given))
    if missing:
        raise ConfigError(
            f"prompt {where!r}: variable %{missing[0]}% is not given (--var {missing[0]}=...)"
        )
    unused = sorted(set(given) - named)
    if unused:
        raise ConfigError(f"prompt {where!r} names no %{unused[0]}%: a misspelt --var?")
    if len(given) > MAX_VARIABLES:
        raise ConfigError(f"prompt {where!r}: at most {MAX_VARIABLES} variables")
    for name, value in given.items():
        if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS:
            raise ConfigError(f"variable {name}: a string of at most {MAX_VALUE_CHARS} characters")


def _fill(text: str, variables: dict[str, str]) -> str:
    return VARIABLE.sub(lambda m: variables[m.group(1)], text)  # one pass: values stay as given


def with_task(
    spec: TaskSpec,
    task: str | None,
    prompt: Path | None,
    variables: Mapping[str, str] | None,
    *,
    workspace: Path | None = None,
    private: tuple[Path, ...] = (),
) -> TaskSpec:
    """`spec` with its task: `task` as given, or the prompt file's.

    A prompt file brings its model (unless `spec` names one), temperature and system part.
    `ConfigError` when both or neither are given.
    """
    if (task is None) == (prompt is None):
        raise ConfigError("give a task or a prompt file, not both" if task else "give a task")
    if prompt is None:
        if variables:
            raise ConfigError("variables go with a prompt file (--prompt)")
        return replace(spec, task=str(task))
    found = load_prompt(prompt, variables, workspace=workspace, private=private)
    return replace(
        spec,
        task=found.user,
        model=spec.model or found.model,
        system=found.system,
        temperature=found.temperature,
    )


def parse_vars(pairs: Sequence[str]) -> dict[str, str]:
    """`--var name=value` flags as a mapping; `ConfigError` names a malformed one."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not VARIABLE.fullmatch(f"%{name}%"):
            raise ConfigError(f"--var {pair[:60]!r}: write NAME=VALUE (NAME: letters, digits, _)")
        if name in out:
            raise ConfigError(f"--var {name} is given twice")
        out[name] = value
    return out
