"""Structured answers: an evaluator's verdict, or the JSON a preset's `output_schema` asks for.

When a trace has a schema, its final answer must hold one JSON object that validates against
it (an evaluator may also answer in the `VERDICT: ... REASONS: ... SUGGESTIONS:` text form).
An answer that does not gets a correction message naming the validation error, and the
model answers again; after `MAX_CORRECTIONS` the trace fails with that error. The accepted
object is stored on the trace (`Trace.output`) and in its parent's collaborator entry, and
the parent's tool result carries it as JSON.

Validation is JSON Schema (Draft 2020-12) through `jsonschema`: pydantic validates models
written in Python, not schemas a project writes in a preset file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fleet.models import Message, Trace

MAX_CORRECTIONS = 2
CORRECTION_KEY = "correction"
"""Metadata of a correction message (user role) the runner sends after a bad answer."""

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["pass", "fail", "partial"]},
        "reasons": {"type": "array", "items": {"type": "string"}},
        "suggestions": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["verdict", "reasons", "suggestions"],
}
"""What every evaluator returns, whatever its preset says."""

_FENCED = re.compile(r"```(?:json)?\s*\n(.*?)```", re.S)
_VERDICT = re.compile(r"VERDICT:\s*\**\s*(pass|fail|partial)\b", re.I)
_SECTION = re.compile(r"^\s*(REASONS|SUGGESTIONS)\s*:\s*$", re.I | re.M)


@dataclass(frozen=True)
class Accepted:
    """The answer stands; `output` is its validated object (None: no schema to meet)."""

    output: dict[str, Any] | None
    kind: Literal["accepted"] = "accepted"


@dataclass(frozen=True)
class Correct:
    """Ask again: `message` names what was wrong."""

    message: Message
    kind: Literal["correct"] = "correct"


@dataclass(frozen=True)
class Rejected:
    """Corrected `MAX_CORRECTIONS` times and still wrong: the trace fails with `error`."""

    error: str
    kind: Literal["rejected"] = "rejected"


Checked = Accepted | Correct | Rejected


def schema_for(
    output_schema: Mapping[str, Any] | None, preset: str, trace: Trace
) -> Mapping[str, Any] | None:
    """The schema the trace's final answer must meet: the verdict for evaluators.

    `output_schema` and `preset`: the trace's preset's schema and name.
    """
    if trace.mode == "evaluate" or preset == "evaluate":
        return VERDICT_SCHEMA
    return output_schema


def instruction(schema: Mapping[str, Any]) -> str:
    """What the system prompt says about the final answer's shape."""
    return (
        "Your final answer (the message without a tool call) must contain one JSON object "
        "that validates against this JSON Schema, in a ```json block or alone:\n"
        + json.dumps(schema, ensure_ascii=False)
    )


def check_final(
    schema: Mapping[str, Any] | None, trace: Trace, answer: str, path: list[Message]
) -> Checked:
    """Whether the final `answer` meets the trace's schema (`schema_for`); what to do if not.

    Args:
        schema: The schema, None when the answer is free text.
        trace: The trace.
        answer: The model's final text (already redacted).
        path: The main path, ending with the model's answer.
    """
    if schema is None:
        return Accepted(None)
    found = parse(answer, schema, verdict_text=schema is VERDICT_SCHEMA)
    if isinstance(found, dict):
        return Accepted(found)
    if corrections(path) >= MAX_CORRECTIONS:
        return Rejected(
            f"the final answer does not match its output schema after {MAX_CORRECTIONS} "
            f"corrections: {found}"
        )
    return Correct(correction(trace.trace_id, found, schema))


def parse(answer: str, schema: Mapping[str, Any], *, verdict_text: bool) -> dict[str, Any] | str:
    """The answer's object if it validates, else the first validation error as text."""
    candidate = json_object(answer)
    if candidate is None and verdict_text:
        candidate = verdict_from_text(answer)
    if candidate is None:
        return "the answer holds no JSON object"
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(schema).iter_errors(candidate), key=lambda e: e.path)
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "the object"
        return f"{where}: {errors[0].message}"
    return candidate


def json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text`: all of it, a fenced block, or its outermost braces."""
    stripped = text.strip()
    candidates = [stripped, *(m.group(1) for m in _FENCED.finditer(text))]
    if "{" in stripped:
        candidates.append(stripped[stripped.index("{") : stripped.rindex("}") + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def verdict_from_text(text: str) -> dict[str, Any] | None:
    """`VERDICT: pass` with `REASONS:` and `SUGGESTIONS:` bullet lists, as an object."""
    found = _VERDICT.search(text)
    if found is None:
        return None
    sections: dict[str, list[str]] = {"reasons": [], "suggestions": []}
    current: list[str] | None = None
    for line in text[found.end() :].splitlines():
        heading = _SECTION.match(line)
        if heading:
            current = sections[heading.group(1).lower()]
        elif current is not None and line.strip().startswith(("-", "*")):
            current.append(line.strip()[1:].strip())
    return {"verdict": found.group(1).lower(), **sections}


def corrections(path: list[Message]) -> int:
    """Correction messages since the last user turn that was not one."""
    count = 0
    for message in reversed(path):
        if message.role != "user" or message.metadata.get("injected"):
            continue
        if not message.metadata.get(CORRECTION_KEY):
            break
        count += 1
    return count


def correction(trace_id: str, error: str, schema: Mapping[str, Any]) -> Message:
    """The user message that asks the model to answer again in the right shape."""
    shape = (
        "a line `VERDICT: pass|fail|partial`, then `REASONS:` and `SUGGESTIONS:` bullet "
        "lists, or the same as a JSON object"
        if schema is VERDICT_SCHEMA
        else "one JSON object that validates against the JSON Schema you were given"
    )
    return Message(
        trace_id=trace_id,
        role="user",
        content=f"Your final answer was not accepted: {error}. Answer again with {shape}.",
        metadata={CORRECTION_KEY: True},
    )
