"""A provider's batch output, read as a stream of JSONL lines each of which may be hostile.

A results file may be hundreds of MiB and each line says whatever the provider (or
whoever answers at its URL) wrote: `NaN`, nesting 200,000 deep, a line of 150 MiB, a custom
id that is not ours. Read here, one line at a time with a per-line cap, so the poller's
memory is bounded by `LINE_MAX_BYTES` (plus what it keeps: the outcomes of its own calls):

- a line over the cap is skipped to its end, never held; its custom id, if its first bytes
  name one of ours, gets an error outcome;
- a line that is not strict JSON (`NaN`/`Infinity` included, or too deep to parse) is that
  call's error the same way;
- a line whose custom id is not one the batch carries is counted and ignored: it never
  answers another call;
- a line naming no readable custom id is counted and skipped: the call it was meant for
  has no answer, and an ended batch's unanswered calls are sent again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from fleet.security.capped import KEEP_BYTES, Oversized, capped_lines

LINE_MAX_BYTES = 8 * 1024 * 1024
"""Longest line read: an answer of 128k output tokens is ~1 MiB of JSON."""
_CUSTOM_ID = re.compile(rb'"custom_id"\s*:\s*"([A-Za-z0-9_-]{1,64})"')


@dataclass(frozen=True)
class Outcome:
    """One request's result: the provider's answer body, or the error it gave."""

    body: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class LineCounts:
    """What a read skipped, for the poller's log (counts only: the lines are hostile)."""

    foreign: int = 0
    unreadable: int = 0


def strict_json(raw: bytes) -> object:
    """The JSON value of `raw`; `ValueError` for anything but strict JSON (NaN, too deep)."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deep") from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def custom_id_in(head: bytes) -> str | None:
    """The custom id a line's first bytes name, if they name one."""
    found = _CUSTOM_ID.search(head[:KEEP_BYTES])
    return found[1].decode() if found else None


def read_outcomes(
    chunks: Iterable[bytes],
    wanted: Collection[str],
    outcome_of: Callable[[dict[str, Any]], Outcome | None],
    found: dict[str, Outcome],
) -> LineCounts:
    """Add to `found` the outcome of each line naming a custom id in `wanted`.

    `outcome_of` reads a parsed line (None: the provider lost that request, it is sent
    again); a line that cannot be read is its custom id's error.
    """
    counts = LineCounts()
    for line in capped_lines(chunks, LINE_MAX_BYTES):
        if isinstance(line, Oversized):
            _refused(line.head, f"answer line over {LINE_MAX_BYTES} bytes", wanted, found, counts)
            continue
        if not line.strip():
            continue
        try:
            value = strict_json(line)
        except ValueError:
            _refused(line, "answer line is not strict JSON", wanted, found, counts)
            continue
        custom_id = value.get("custom_id") if isinstance(value, dict) else None
        if not isinstance(custom_id, str) or not isinstance(value, dict):
            counts.unreadable += 1
        elif custom_id not in wanted:
            counts.foreign += 1
        elif (outcome := outcome_of(value)) is not None:
            found[custom_id] = outcome
    return counts


def _refused(
    head: bytes, why: str, wanted: Collection[str], found: dict[str, Outcome], counts: LineCounts
) -> None:
    custom_id = custom_id_in(head)
    if custom_id is None:
        counts.unreadable += 1
    elif custom_id not in wanted:
        counts.foreign += 1
    else:
        found[custom_id] = Outcome(error=why)
