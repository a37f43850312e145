r"""What a person is shown of a tool call waiting for approval, and the digest it binds to.

A call is shown one argument a line. Every argument a tool acts on (a name holding path,
command, url, file, dir, target, ... — see `ACTED_ON`) comes first and in full, whatever
its length; then the other arguments, shortest first, each in full up to
`OTHER_VALUE_CHARS` and all of them up to `OTHERS_CHARS`: whatever is cut ends with an
explicit `… N more characters` marker, so padding can neither push the real target out of
sight nor hide that something was left out. Every value is JSON (quotes, `\n`), and every
character a terminal or a page could act on (C0/C1 controls, escape sequences, bidi
overrides, line separators) is written as a `\uXXXX` escape: nothing in a call can move
the cursor, recolour or hide a part of what the approver reads.

The digest is of the call as it is stored and will run (its trace, id, name and raw
arguments, the worker's secrets masked as everywhere the conversation is written) and is
shown beside it: `fleet approve --digest`, the terminal prompt and the page send the
digest they showed, and an approval whose digest is not the waiting call's is refused.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from typing import Any

ACTED_ON = (
    "path", "file", "dir", "folder", "command", "cmd", "script", "code", "url", "uri",
    "host", "target", "dest", "source", "src", "repo", "branch", "query", "sql",
)  # fmt: skip
"""Argument names (any part of the name, any case) shown first and never cut."""
OTHER_VALUE_CHARS = 400
OTHERS_CHARS = 4000
DIGEST_CHARS = 32
"""Hex characters of the sha256 kept: 128 bits."""
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def call_digest(trace_id: str, call_id: str, name: str, arguments: str) -> str:
    """The digest an approval of this call (in this trace, as it will run) must carry.

    The trace and call ids are in it: the same call waiting in two trees has two digests,
    so what a person saw of one never answers the other.
    """
    canonical = json.dumps([trace_id, call_id, name, arguments], ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS]


def neutral(text: str) -> str:
    """`text` with every control, format or unassigned character as a JSON-style escape."""
    return "".join(
        f"\\u{ord(c):04x}" if unicodedata.category(c) in _UNSAFE_CATEGORIES else c for c in text
    )


def show_call(name: str, arguments: str) -> str:
    """The call as lines: its name, then one `  name: value` line per argument.

    `arguments` is the raw JSON the model sent (secrets masked by the caller); text that
    is not a JSON object is shown as one value, cut like any other.
    """
    try:
        parsed: Any = json.loads(arguments or "{}")
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raw = _cut(neutral(arguments))
        return f"{neutral(name)}\n  (arguments that are not a JSON object): {raw}"
    return "\n".join([neutral(name), *_argument_lines(parsed)])


def _argument_lines(arguments: dict[str, Any]) -> list[str]:
    """Acted-on arguments in full, then the others shortest first within the budget."""
    shown = {str(key): _value(value) for key, value in arguments.items()}
    acted = [key for key in shown if _acted_on(key)]
    others = sorted((key for key in shown if not _acted_on(key)), key=lambda k: len(shown[k]))
    lines = [f"  {_key(key)}: {shown[key]}" for key in acted]
    budget = OTHERS_CHARS
    for key in others:
        value = _cut(shown[key], min(OTHER_VALUE_CHARS, max(budget, 0)))
        budget -= len(shown[key])
        lines.append(f"  {_key(key)}: {value}")
    return lines


def _acted_on(key: str) -> bool:
    return any(part in key.lower() for part in ACTED_ON)


def _key(key: str) -> str:
    return neutral(json.dumps(key, ensure_ascii=False)[1:-1])


def _value(value: Any) -> str:
    return neutral(json.dumps(value, ensure_ascii=False, sort_keys=True))


def _cut(text: str, limit_chars: int = OTHER_VALUE_CHARS) -> str:
    """`text` up to `limit_chars`, then how much was left out."""
    if len(text) <= limit_chars:
        return text
    return f"{text[:limit_chars]} … {len(text) - limit_chars:,} more characters"
