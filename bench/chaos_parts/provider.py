"""A provider on the OpenAI wire that fails, hangs and answers garbage on purpose.

`FlakyProvider` (bench/fault_rig.py) answers an explore (a root asks for `agent` over
`BRANCHES` tasks named `Branch i of the survey`, each branch looks around, then answers)
and fails a share of its calls with 500, 503 or 429. This one adds, per call, at a rate:
a malformed body (cut JSON), NaN usage, an answer nested 100,000 brackets deep, and a
hang longer than the client waits; `down_for(seconds)` (every call 503 meanwhile); and
`limit_for(seconds)` (a rate limit: every call 429 with `Retry-After: 1` meanwhile).
Each is one model call's error: the run retries it, fails over or fails, and ends.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from bench.fault_rig import FlakyProvider

BRANCHES, TURNS = 3, 1
MODEL = "flaky"
HOSTILE = ("cut", "nan", "deep", "hang")
HANG_S = 8.0


class HostileProvider(FlakyProvider):
    """`FlakyProvider`, plus hostile answers at `hostile_rate`."""

    def __init__(self, failure_rate: float, hostile_rate: float, seed: int) -> None:
        """A seeded chooser of which calls fail and how."""
        super().__init__(BRANCHES, TURNS, latency_s=0.1, failure_rate=failure_rate)
        self.hostile_rate = hostile_rate
        self.hostile: dict[str, int] = dict.fromkeys(HOSTILE, 0)
        self._draw = random.Random(seed)
        self._draw_lock = threading.Lock()
        self.limited = False
        self.rate_limited = 0
        """Rate-limit windows opened (`limit_for`)."""

    def down_for(self, seconds: float) -> None:
        """Every call answers 503 for `seconds` (a provider outage)."""
        self.down = True
        timer = threading.Timer(seconds, setattr, args=(self, "down", False))
        timer.daemon = True
        timer.start()

    def limit_for(self, seconds: float) -> None:
        """Every call answers 429 with `Retry-After: 1` for `seconds` (a rate limit hit)."""
        self.limited = True
        self.rate_limited += 1
        timer = threading.Timer(seconds, setattr, args=(self, "limited", False))
        timer.daemon = True
        timer.start()

    def respond(self, body: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        """A hostile answer at `hostile_rate`, else the flaky provider's."""
        if self.limited:
            error = {"error": {"message": "rate limit reached", "type": "rate_limit_exceeded"}}
            return 429, [("retry-after", "1")], json.dumps(error).encode()
        with self._draw_lock:
            kind = self._draw.choice(HOSTILE) if self._draw.random() < self.hostile_rate else ""
            if kind:
                self.hostile[kind] += 1
        if kind == "hang":
            time.sleep(HANG_S)
        elif kind == "cut":
            return 200, [], b'{"id": "chatcmpl-cut", "choices": [{"index": 0, "mess'
        elif kind == "deep":
            return 200, [], b"[" * 100_000 + b"]" * 100_000
        status, headers, raw = super().respond(body)
        if kind == "nan" and status == 200:
            reply = json.loads(raw)
            reply["usage"]["prompt_tokens"] = float("nan")
            raw = json.dumps(reply).encode()  # NaN as JSON's (invalid) literal
        return status, headers, raw


def turns() -> dict[str, int]:
    """Task regex -> most model turns, for the invariants."""
    return {r"^Branch \d+ of the survey": TURNS + 1}
