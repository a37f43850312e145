"""What Flower shows for a task: mode, trace ids and the first words, never a whole prompt.

Flower (and every event consumer) sees `argsrepr` and the `shadow` name, so both are built
from a few words of the task, each word capped in length, and any word that looks like a
credential (an `sk-...` key, a `token=...` pair, a long random string) masked.
"""

from __future__ import annotations

import re

from fleet.models import Trace

TASK_WORDS = 8
MAX_WORD_CHARS = 24
"""A single 'word' (no spaces) cannot smuggle a whole prompt."""
MAX_WORDS_CHARS = 80
REDACTED = "[redacted]"
_SECRET_PREFIX = re.compile(
    r"^(?:(?:sk|pk|rk)-|sk_|ghp_|gho_|ghs_|github_pat_|xox[abprs]-|hf_)[A-Za-z0-9_\-]{6,}"
    r"|^AKIA[0-9A-Z]{12,}|^AIza[0-9A-Za-z_\-]{20,}"
)
_SECRET_PAIR = re.compile(r"(key|token|secret|password|passwd|pwd|auth)\w*[=:]", re.IGNORECASE)
_LONG_RANDOM = re.compile(r"^[A-Za-z0-9_\-+/=.]{20,}$")


def looks_secret(word: str) -> bool:
    """An API key, a `name=value` credential, or a long mixed letters-and-digits string."""
    if _SECRET_PREFIX.match(word) or _SECRET_PAIR.search(word):
        return True
    return bool(
        _LONG_RANDOM.match(word) and re.search(r"\d", word) and re.search(r"[A-Za-z]", word)
    )


def first_words(text: str, words: int = TASK_WORDS) -> str:
    """The first few words of a task, on one line, credentials masked, length capped."""
    parts = text.split()
    shown = [REDACTED if looks_secret(w) else _cap(w) for w in parts[:words]]
    head = " ".join(shown)
    if len(head) > MAX_WORDS_CHARS:
        return head[: MAX_WORDS_CHARS - 2].rstrip() + " …"
    return head + (" …" if len(parts) > words else "")


def _cap(word: str) -> str:
    return word if len(word) <= MAX_WORD_CHARS else word[: MAX_WORD_CHARS - 1] + "…"


def task_repr(trace: Trace) -> str:
    """`argsrepr`: ids and the first words of the task."""
    parent = trace.parent_trace_id or "-"
    return (
        f"({trace.trace_id!r}) mode={trace.mode} parent={parent} task={first_words(trace.task)!r}"
    )


def shadow_name(trace: Trace) -> str:
    """The name Flower lists instead of `fleet.run_agent`."""
    return f"fleet.{trace.mode}: {first_words(trace.task, 5)}"
