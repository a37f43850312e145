"""What Flower shows for a task: mode, trace ids and the first words, never a whole prompt.

Flower (and every event consumer, and the broker's copy of the message) sees `argsrepr`
and the `shadow` name, so both are built from a few words of the task, each word capped in
length, every secret this process knows and every credential shape redacted first (so
`"sk-live-..."`, `(key=...)` or `token:'...'` go whatever quotes surround them), then any
word that still looks like a credential (a long random string) masked.

`RedactingEvents` is the last layer: every event this process sends (task-sent,
received, started, failed with its exception and traceback, succeeded with its result)
has its text fields redacted before it leaves, whoever built them.
"""

from __future__ import annotations

import re
from typing import Any

from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher

from fleet.models import Trace
from fleet.redact import REDACTED, Redactor, process_redactor

__all__ = ["REDACTED", "RedactingEvents", "first_words", "looks_secret", "shadow_name", "task_repr"]

TASK_WORDS = 8
MAX_WORD_CHARS = 24
"""A single 'word' (no spaces) cannot smuggle a whole prompt."""
MAX_WORDS_CHARS = 80
_PUNCTUATION = "\"'`()[]{}<>,;:.!?*|"
_SECRET_PAIR = re.compile(r"(key|token|secret|password|passwd|pwd|auth)\w*[=:]", re.IGNORECASE)
_LONG_RANDOM = re.compile(r"^[A-Za-z0-9_\-+/=.]{20,}$")


def looks_secret(word: str) -> bool:
    """A `name=value` credential, or a long mixed letters-and-digits string.

    Quotes and brackets around the word are ignored: `"AbC123...xyz"` is as secret as the
    bare value.
    """
    core = word.strip(_PUNCTUATION)
    if _SECRET_PAIR.search(word) or process_redactor()(core) != core:
        return True
    return bool(
        _LONG_RANDOM.match(core) and re.search(r"\d", core) and re.search(r"[A-Za-z]", core)
    )


def first_words(text: str, words: int = TASK_WORDS, redactor: Redactor | None = None) -> str:
    """The first few words of a task, on one line, credentials masked, length capped."""
    parts = (redactor or process_redactor())(text).split()
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


def redact_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """An event's fields with every text value redacted (ids and numbers pass unchanged)."""
    redactor = process_redactor()
    return {k: redactor(v) if isinstance(v, str) else v for k, v in fields.items()}


class RedactingDispatcher(EventDispatcher):  # type: ignore[misc]
    """Celery's event dispatcher, redacting each event's text fields before sending."""

    def send(self, type: str, *args: Any, **fields: Any) -> Any:
        """See `EventDispatcher.send`."""
        options = {k: fields.pop(k) for k in _SEND_OPTIONS if k in fields}
        return super().send(type, *args, **options, **redact_fields(fields))

    def publish(self, type: str, fields: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """See `EventDispatcher.publish` (the client's `task-sent` goes this way)."""
        return super().publish(type, redact_fields(fields), *args, **kwargs)


_SEND_OPTIONS = ("blind", "utcoffset", "retry", "retry_policy", "Event")


class RedactingEvents(Events):  # type: ignore[misc]
    """`app.events` whose dispatchers are `RedactingDispatcher`s."""

    dispatcher_cls = "workers.naming:RedactingDispatcher"
