"""Celery's Redis result backends, subclassed: no subscriptions while sending; the fleet's join.

Written and tested against Celery 5.7.0 (`celery[redis]>=5.7,<5.8`, redis-py 8.1.0).
`workers.app.FleetCelery._get_backend` (Celery's private `Celery._get_backend`: the three
lines that build `app.backend` from `by_url`) picks these classes through `fleet_class`.
Two switches (`workers.patches.switches`) live here:

- `send-only-results`: `add_pending_result(result, weak=False, start_drainer=True)`
  (`celery.backends.asynchronous.AsyncBackendMixin`) registers a result with the
  backend's `result_consumer` (`consume_from(task_id)`: a SUBSCRIBE to its result channel)
  for every header a chord send registers (`apply_chord` builds a `GroupResult`). Off:
  every registration subscribes, as upstream.
- `fleet-join`: `apply_chord(header_result_args, body)`, `set_chord_size(group_id,
  chord_size)` (the `.s` key only Celery's join reads) and `on_chord_part_return(request,
  state, result)` (called by `BaseBackend.mark_as_done`/`mark_as_failure` for every header
  with `request.chord`, its result stored or not: `ignore_result` headers too) hand a
  fleet chord to `workers.patches.chord_join`. Which join a chord gets is decided by its
  body (`chord_join.is_fleet_join`), so a chord in flight keeps its join whatever the
  switch says now; the switch decides what `workers.dispatch` sends (see chord_join).

With both off `fleet_class` returns Celery's own class (a fleet chord still in flight then
never completes: switch both off only with no explore running).
"""

from __future__ import annotations

import logging
from typing import Any

from celery.backends.redis import RedisBackend, SentinelBackend

from fleet.storage.backends.redis.connect import Lua
from fleet.storage.outage import is_outage, warn_failed
from workers.patches import chord_join
from workers.patches.switches import enabled

log = logging.getLogger(__name__)


class SendOnlyRedisBackend(RedisBackend):  # type: ignore[misc]
    """Celery's Redis result backend: no subscriptions while sending; the fleet's own join.

    Sending a chord registers every header result with the sender's backend (the
    `GroupResult` that `apply_chord` builds, and the group's barrier), and each
    registration subscribes the sender to that task's result channel: a round trip per
    branch, and in a worker a subscription nobody reads. Nothing that sends inside
    `one_pipeline` waits on those results (the chord body runs from the header tasks'
    own counter), so registrations made there are dropped; everywhere else (`get`, `then`)
    this is `RedisBackend`.

    A chord whose body is `fleet.children.collect` with its size in its options
    (`workers.patches.chord_join.is_fleet_join`) is joined by `workers.patches.chord_join`:
    nothing is written when it
    is sent (no `.s` size key, no saved group), each header part counted once. Every
    other chord gets Celery's join.
    """

    _fleet_group: str | None = None
    """The group of the fleet chord this thread is sending (its size key is not written)."""

    fleet_join_script = Lua(chord_join.PART_RETURN)
    """`workers.patches.chord_join.PART_RETURN`: `fleet_join_script(backend.client, keys, args)`."""

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> None:
        """Celery's, except for a fleet chord: nothing to save, and no size key to write."""
        if chord_join.is_fleet_join(body):
            self._fleet_group = header_result_args[0]
            return
        self._fleet_group = None
        super().apply_chord(header_result_args, body, **kwargs)

    def set_chord_size(self, group_id: str, chord_size: int) -> None:
        """Celery's `.s` key, which only Celery's join reads: not for a fleet chord."""
        if group_id != self._fleet_group:
            super().set_chord_size(group_id, chord_size)

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        """A header task ended (any state, its result stored or not): count it in its chord."""
        if chord_join.is_fleet_join(request.chord):
            try:
                chord_join.part_returned(self, request, state, result)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # Celery logged this as a traceback "outside body" and went on all the
                # same; the part left uncounted is the owner check's (it settles the
                # parent from the children's ends), so one line says it.
                warn_failed(log, "chord part %s not counted", request.id)
        else:
            super().on_chord_part_return(request, state, result, **kwargs)

    def add_pending_result(
        self, result: Any, weak: bool = False, start_drainer: bool = True
    ) -> Any:
        """Register a result someone waits on; not while this thread sends in one pipeline."""
        pipelined = getattr(getattr(self.app, "_pipelined", None), "producer", None)
        if pipelined is not None and enabled("send-only-results"):
            return result
        return super().add_pending_result(result, weak=weak, start_drainer=start_drainer)


class SendOnlySentinelBackend(SendOnlyRedisBackend, SentinelBackend):  # type: ignore[misc]
    """`SendOnlyRedisBackend` on Celery's Sentinel backend (a `sentinel://` result backend).

    The method resolution order puts `SendOnlyRedisBackend`'s overrides first and lets
    their `super()` calls reach `SentinelBackend`, which finds the master through the
    sentinels (`result_backend_transport_options["master_name"]`).
    """


def fleet_class(backend: type[Any]) -> type[Any]:
    """The class `app.backend` is built with: the fleet's for Celery's two Redis backends."""
    if not (enabled("send-only-results") or enabled("fleet-join")):
        return backend
    if backend is RedisBackend:
        return SendOnlyRedisBackend
    if backend is SentinelBackend:
        return SendOnlySentinelBackend
    return backend
