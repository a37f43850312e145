"""Which Celery/kombu patches this process runs: the names, the operator's switch, undo.

The operator switches patches off with `FLEET_CELERY_PATCHES_OFF` (`fleet.settings`:
`Settings.celery_patches_off`), a comma list of the names in `PATCHES`, or `all`;
`workers.patches.configure` applies it where the app is configured. Until then every
patch counts as on (`enabled`), as it did before there was a switch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fleet.errors import ConfigError

ENV_NAME = "FLEET_CELERY_PATCHES_OFF"
ALL = "all"

PATCHES: dict[str, str] = {
    "kombu-unacked-script": "a delivered message's unacked entries in one Lua script",
    "kombu-batched-acks": "acks of one event-loop turn removed in one script",
    "kombu-broker-loss": "a lost Redis broker connection is logged, not a worker exit",
    "kombu-pool-client": "one redis-py client per kombu connection pool",
    "kombu-declare-cache": "kombu's cache of declared entities looked at first",
    "send-only-results": "no result subscriptions while a chord is sent",
    "fleet-join": "the fleet's chord join: each header part once, the body once",
    "chord-send": "a chord sent without Celery's canvas clones",
    "header-template": "a chord's header messages from the first one's message",
    "event-batching": "task events in batches per interval and per chord",
    "event-repr": "a run's result shown in its task-succeeded event without saferepr",
    "consumer-reconnect": "a consumer retries a lost broker every 1-2 s, not up to 30 s apart",
    "root-message": "a new root's task message put by the script that queues the root",
}
"""Every patch by its switch name, in the order they are installed, with what it does."""

Undo = Callable[[], None]
"""Puts back what one replacement changed."""

_off: frozenset[str] = frozenset()


def parse(names: Iterable[str]) -> frozenset[str]:
    """The patch names an operator listed (`all`: every one); `ConfigError` names a wrong one."""
    wanted = {name.strip().lower() for name in names if name.strip()}
    if ALL in wanted:
        return frozenset(PATCHES)
    unknown = sorted(wanted - set(PATCHES))
    if unknown:
        known = ", ".join((*PATCHES, ALL))
        raise ConfigError(f"{ENV_NAME}: unknown patch {unknown[0]!r}; known: {known}")
    return frozenset(wanted)


def set_off(names: frozenset[str]) -> None:
    """Record which patches are off in this process (`workers.patches.configure` calls it)."""
    global _off
    _off = names


def enabled(name: str) -> bool:
    """Whether the patch `name` is on in this process (on until configured otherwise)."""
    assert name in PATCHES, name
    return name not in _off


def replace(owner: object, attribute: str, new: object) -> Undo:
    """Set `owner.attribute` to `new`; the returned call puts back what was there.

    An attribute `owner` inherited (not in its own `__dict__`) is deleted again, so the
    inherited one shows through as before.
    """
    own = vars(owner)
    had = attribute in own
    old = own.get(attribute)
    setattr(owner, attribute, new)

    def undo() -> None:
        if had:
            setattr(owner, attribute, old)
        else:
            delattr(owner, attribute)

    return undo
