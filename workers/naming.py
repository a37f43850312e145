"""What Flower shows for a task: mode, trace ids and the first words, never a whole prompt.

Flower (and every event consumer, and the broker's copy of the message) sees `argsrepr`
and the `shadow` name, so both are built from a few words of the task, each word capped in
length, every secret this process knows and every credential shape redacted first (so
`"sk-live-..."`, `(key=...)` or `token:'...'` go whatever quotes surround them), then any
word that still looks like a credential (a long random string) masked.

`workers.events.RedactingEvents` is the last layer: every event this process sends has its
text fields redacted before it leaves, whoever built them.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from fleet.models import Trace
from fleet.security.redact import REDACTED, Redactor
from fleet.settings import process_redactor

__all__ = [
    "REDACTED",
    "first_words",
    "looks_secret",
    "shadow_name",
    "task_names",
    "task_repr",
    "trace_page",
]

TASK_WORDS = 8
SHADOW_WORDS = 5
MAX_WORD_CHARS = 24
"""A single 'word' (no spaces) cannot smuggle a whole prompt."""
MAX_WORDS_CHARS = 80
_PUNCTUATION = "\"'`()[]{}<>,;:.!?*|"
_SECRET_PAIR = re.compile(
    r"(?:key|token|secret|password|passwd|pwd|auth)[=:](?P<value>.*)", re.IGNORECASE
)
"""`api_key=X`, `token:X`, `key:` (the value may be the next word): the name ends in a
credential word. Not `tokens:400`, `max_tokens=4096`, `author:` or `keyboard:` (a count or
a plain word whose name merely starts like one)."""
_COUNT = re.compile(r"\d{1,5}")
"""A value of a few digits is a count (`token:400`), not a secret (MIN_SECRET_CHARS is 6)."""
_LONG_RANDOM = re.compile(r"^[A-Za-z0-9_\-+/=.]{20,}$")


def looks_secret(word: str) -> bool:
    """A `name=value` credential, or a long mixed letters-and-digits string.

    Quotes and brackets around the word are ignored: `"AbC123...xyz"` is as secret as the
    bare value.
    """
    core = word.strip(_PUNCTUATION)
    pair = _SECRET_PAIR.search(word)
    if pair and not _COUNT.fullmatch(pair.group("value").strip(_PUNCTUATION)):
        return True
    if process_redactor()(core) != core:
        return True
    return bool(
        _LONG_RANDOM.match(core) and re.search(r"\d", core) and re.search(r"[A-Za-z]", core)
    )


def first_words(text: str, words: int = TASK_WORDS, redactor: Redactor | None = None) -> str:
    """The first few words of a task, on one line, credentials masked, length capped."""
    return _head(*_shown_words(text, words, redactor), words)


def _shown_words(text: str, words: int, redactor: Redactor | None) -> tuple[list[str], int]:
    """The first `words` words as shown (masked, capped), and how many words there are."""
    parts = (redactor or process_redactor())(text).split()
    return [REDACTED if looks_secret(w) else _cap(w) for w in parts[:words]], len(parts)


def _head(shown: list[str], total: int, words: int) -> str:
    """The first `words` of the shown words, capped, with `…` when some were left out."""
    head = " ".join(shown[:words])
    if len(head) > MAX_WORDS_CHARS:
        return head[: MAX_WORDS_CHARS - 2].rstrip() + " …"
    return head + (" …" if total > words else "")


def _cap(word: str) -> str:
    return word if len(word) <= MAX_WORD_CHARS else word[: MAX_WORD_CHARS - 1] + "…"


def task_names(trace: Trace) -> tuple[str, str]:
    """`task_repr` and `shadow_name` together: the task's words are masked once for both."""
    shown, total = _shown_words(trace.task, TASK_WORDS, None)
    return _task_repr(trace, _head(shown, total, TASK_WORDS)), _shadow(
        trace, _head(shown, total, SHADOW_WORDS)
    )


def task_repr(trace: Trace) -> str:
    """`argsrepr`: ids and the first words of the task."""
    return _task_repr(trace, first_words(trace.task))


def shadow_name(trace: Trace) -> str:
    """The name Flower lists instead of `fleet.run_agent`."""
    return _shadow(trace, first_words(trace.task, SHADOW_WORDS))


def _task_repr(trace: Trace, words: str) -> str:
    parent = trace.parent_trace_id or "-"
    return f"({trace.trace_id!r}) mode={trace.mode} parent={parent} task={words!r}"


def _shadow(trace: Trace, words: str) -> str:
    return f"fleet.{trace.mode}: {words}"


def trace_page(trace_id: str, template: str | None) -> str | None:
    """`kwargsrepr`: the trace page of `trace_id` from FLEET_TRACE_URL_TEMPLATE, if set.

    Flower shows it as the task's kwargs (and its search finds it); the id is URL-quoted,
    its `@` kept, so a child's page reads as its id.
    """
    if template is None:
        return None
    url = template.replace("{trace_id}", quote(trace_id, safe="@"))
    return f"trace_page={url}"
