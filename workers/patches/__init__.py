"""Every place the fleet patches Celery or kombu, each pinned to the versions it targets.

Written and tested against Celery 5.7.0, kombu 5.7.0 and redis-py 8.1.0 (pyproject pins
`celery[redis]>=5.7,<5.8` and `kombu>=5.7,<5.8`). Each module's docstring names the
upstream functions and behaviour its patch changes or relies on;
tests/test_celery_patches.py asserts each of those on Celery and kombu themselves, so an
upgrade that changes one fails there first. Each patch has a switch name
(`switches.PATCHES`); the operator turns patches off with `FLEET_CELERY_PATCHES_OFF`
(a comma list of names, or `all`), applied by `configure` where the app is configured
(`workers.app.configured`: a worker before it connects, a client when it builds its app).

| name | module | what it does |
|---|---|---|
| `kombu-unacked-script` | kombu_redis | a delivered message's unacked entries in one script |
| `kombu-batched-acks` | kombu_redis | the acks of one event-loop turn removed in one script |
| `kombu-broker-loss` | kombu_redis | a lost broker connection is logged, not a worker exit |
| `kombu-pool-client` | kombu_redis | one redis-py client per kombu connection pool |
| `kombu-declare-cache` | kombu_redis | kombu's cache of declared entities looked at first |
| `send-only-results` | result_backend | no result subscriptions while a chord is sent |
| `fleet-join` | result_backend, chord_join | the fleet's chord join |
| `chord-send` | chords | a chord sent without the canvas's signature clones |
| `header-template` | header_messages | header messages from the first one's message |
| `event-batching` | events | task events in batches (per interval, per chord) |
| `event-repr` | events | a run's shown result without `saferepr` |
| `consumer-reconnect` | reconnect | a lost broker retried every 1-2 s, not up to 30 s apart |

Two change correctness when off, and say so in their docstrings: `kombu-broker-loss` (a
worker exits when its Redis broker connection breaks with work unacknowledged) and
`fleet-join` (new chords use Celery's own join: no outbox net for a claimer that dies,
and a header counted by task id only as far as Celery 5.7 does). The others are cost.
Redaction of events (`workers.events`) and of task names (`workers.naming`) is not a
patch and has no switch.

The thin users stay where they are: `workers.app` (the app, `one_pipeline`),
`workers.dispatch` (which chord to send), `workers.tasks` (a run counts its join part).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from workers.patches import events, kombu_redis, reconnect
from workers.patches.switches import Undo, parse, set_off

GLOBAL_INSTALLS: dict[str, Callable[[], list[Undo]]] = {
    **kombu_redis.INSTALLS,
    "event-repr": events.install_result_repr,
    **reconnect.INSTALLS,
}
"""The patches that replace a Celery or kombu attribute for the whole process, in order.
The others are read where they act (`switches.enabled`)."""

_installed: list[tuple[str, list[Undo]]] = []
_configured: frozenset[str] | None = None


def configure(off: Iterable[str]) -> None:
    """Switch the named patches off and every other one on, in this process.

    Idempotent; a different set puts every replaced attribute back (in reverse order) and
    installs the patches now on, so what is off is exactly upstream.

    Raises:
        ConfigError: a name that is no patch (one line, listing the names).
    """
    global _configured
    names = parse(off)
    if names == _configured:
        return
    for _, undos in reversed(_installed):
        for undo in reversed(undos):
            undo()
    _installed.clear()
    set_off(names)
    for name, install in GLOBAL_INSTALLS.items():
        if name not in names:
            _installed.append((name, install()))
    _configured = names


def installed() -> tuple[str, ...]:
    """The process-wide patches installed now, in install order."""
    return tuple(name for name, _ in _installed)
