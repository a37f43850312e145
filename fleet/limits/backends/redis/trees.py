"""Each tree's schedule and run window on Redis (`fleet.limits.trees`)."""

from __future__ import annotations

import threading

import redis

from fleet.limits.backends.redis import scripts as limit_scripts
from fleet.limits.trees import DEFAULT_SCHEDULE, Priority, Schedule
from fleet.storage import keys


class Trees:
    """Every tree's schedule and run window on one Redis (decoded responses)."""

    def __init__(self, client: redis.Redis) -> None:
        """Register the script; schedules are cached (they never change after submit)."""
        self._client = client
        self._window = client.register_script(limit_scripts.WINDOW)
        self._cache: dict[str, Schedule] = {}
        self._lock = threading.Lock()

    def create(self, root_trace_id: str, schedule: Schedule) -> None:
        """Record a new tree's schedule (nothing for the default one)."""
        if schedule == DEFAULT_SCHEDULE:
            return
        fields: dict[str, str | int] = {"priority": schedule.priority}
        if schedule.max_concurrent is not None:
            fields["max_concurrent"] = schedule.max_concurrent
        pipe = self._client.pipeline()
        pipe.hset(keys.tree(root_trace_id), mapping=fields)  # type: ignore[arg-type]
        pipe.expire(keys.tree(root_trace_id), keys.TRACE_TTL_S)
        pipe.execute()

    def schedule(self, root_trace_id: str) -> Schedule:
        """The tree's schedule; read from Redis once per tree and process."""
        with self._lock:
            if (known := self._cache.get(root_trace_id)) is not None:
                return known
        data = self._client.hgetall(keys.tree(root_trace_id))
        limit = data.get("max_concurrent")
        priority: Priority = "batch" if data.get("priority") == "batch" else "interactive"
        schedule = Schedule(int(limit) if limit else None, priority)
        with self._lock:
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[root_trace_id] = schedule
        return schedule

    def window(
        self, root_trace_id: str, limit: int, *, ended: str = "", new: tuple[str, ...] = ()
    ) -> list[str]:
        """Free `ended`'s slot, queue `new` children; the children to start now, in order."""
        script_keys = [keys.window_running(root_trace_id), keys.window_pending(root_trace_id)]
        args: list[str | int] = [limit, keys.TRACE_TTL_S, ended, *new]
        return [str(i) for i in self._window(keys=script_keys, args=args)]
