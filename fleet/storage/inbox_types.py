"""The values of a trace's inbox (`fleet.storage.inbox`): a message, its entry, the caps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleet.models import Record

Refusal = Literal["missing", "ended", "rate", "full", "sender_rate"]
"""Why `post` refused: no such trace, it ended, too many this minute or in all, or the
sending trace sent too many this minute."""


class Posted(Record):
    """One message as the inbox stream holds it (JSON in field `m`)."""

    sender: str
    """Who sent it, as shown to the model (quoted as data): `--from`, a name, a trace id."""
    content: str
    conversation_id: str = ""
    """The sender's thread, passed back in `check_messages` so an answer can name it."""
    sender_trace_id: str | None = None
    """For `send_message`: the sending trace (same tree)."""
    interrupt: bool = False
    """Delivered in full at the next model call, which is started at once."""
    sent_at_ms: int = 0


@dataclass(frozen=True)
class InboxEntry:
    """A message and its stream id (`ms-seq`, increasing)."""

    entry_id: str
    posted: Posted


@dataclass(frozen=True)
class InboxLimits:
    """The caps `post` checks (`fleet.conversation.messages` holds the fleet's values)."""

    per_minute: int
    """Messages one trace may receive in any 60 s."""
    max_messages: int
    """Messages one trace may receive in all."""
    sends_per_minute: int
    """Messages one trace may send (`send_message`) per minute."""


class Refused(Exception):  # noqa: N818  (a value the caller turns into its own error)
    """`post` refused the message; `why` says which rule."""

    def __init__(self, why: Refusal) -> None:
        """Refused for `why`."""
        super().__init__(why)
        self.why: Refusal = why


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream id as a sortable pair; `ValueError` for anything else."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
