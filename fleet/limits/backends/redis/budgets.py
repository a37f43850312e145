"""Every tree's budget on Redis: `fleet.limits.budget` says what a budget holds and refuses."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

import redis

from fleet.limits.backends.redis import scripts as limit_scripts
from fleet.limits.budget import (
    FINAL_SHARE,
    UNBUDGETED,
    Budget,
    BudgetState,
    Exhausted,
    Paused,
    Reservation,
    Reserved,
    budget_fields,
    spawn_refusal,
    state_of,
)
from fleet.storage import keys
from fleet.storage.backends.redis import split as redis_split
from fleet.storage.backends.redis.connect import is_cluster


class Budgets:
    """Every tree's budget on one Redis (decoded responses)."""

    def __init__(self, client: redis.Redis) -> None:
        """Register the scripts."""
        self._client = client
        self._reserve = client.register_script(limit_scripts.BUDGET_RESERVE)
        self._settle = client.register_script(limit_scripts.BUDGET_SETTLE)
        self._spawn = client.register_script(limit_scripts.BUDGET_SPAWN)
        self._release = client.register_script(limit_scripts.BUDGET_RELEASE)
        self._known: dict[str, bool] = {}
        self._lock = threading.Lock()

    def create(self, root_trace_id: str, budget: Budget) -> None:
        """Write a new tree's budget (before its root is enqueued)."""
        fields = budget_fields(budget)
        pipe = self._client.pipeline()
        pipe.hset(keys.budget(root_trace_id), mapping=cast(Any, fields))
        pipe.expire(keys.budget(root_trace_id), keys.TRACE_TTL_S)
        pipe.execute()

    def has(self, root_trace_id: str) -> bool:
        """Whether the tree has a budget; asked of Redis once per tree and process."""
        with self._lock:
            known = self._known.get(root_trace_id)
        if known is None:
            known = bool(self._client.exists(keys.budget(root_trace_id)))
            self.learn(root_trace_id, known)
        return known

    def learn(self, root_trace_id: str, budgeted: bool) -> None:
        """Remember what a read made anyway (`begin_run`) found: `has` asks no more."""
        with self._lock:
            if len(self._known) > 100_000:  # a long-lived worker sees many trees
                self._known.clear()
            self._known[root_trace_id] = budgeted

    def reserve(
        self,
        trace_id: str,
        root_trace_id: str,
        est_tokens: int,
        est_usd: float,
        pause_keys: Sequence[str] = (),
    ) -> Reservation:
        """Reserve one call's estimate; `Exhausted` once the tree is spent.

        `pause_keys`: provider pauses (`fleet.limits.providers.pause_keys`) checked in the same
        script, for a call the limiter does not book: while one is set, `Paused` and no
        reservation.
        """
        if not self.has(root_trace_id):
            return UNBUDGETED
        script_keys = [keys.budget(root_trace_id), keys.budget_held(root_trace_id)]
        if is_cluster(self._client):  # the pauses are in the limiter's slot: read apart
            paused_ms = max(redis_split.pause_ttls(self._client, pause_keys), default=0)
            if paused_ms > 0:
                return Paused(paused_ms / 1000)
        else:
            script_keys += pause_keys
        is_root = "1" if trace_id == root_trace_id else "0"
        args: list[str | int] = [trace_id, est_tokens, repr(float(est_usd)), is_root]
        args.append(keys.TRACE_TTL_S)
        ok, why, newly = self._reserve(keys=script_keys, args=args)
        if int(ok) == 3:
            return Paused(int(why) / 1000)
        if int(ok) == 1:
            return Reserved(budgeted=why != "none")
        if int(ok) == 2:
            return Reserved(final=True)
        if int(newly):
            self._client.hincrby(keys.limit_stats(), f"budget_exhausted:{why}", 1)
        return Exhausted(str(why))

    def settle(
        self,
        trace_id: str,
        root_trace_id: str,
        used_tokens: int,
        used_usd: float,
        *,
        final_refund: bool = False,
    ) -> None:
        """Replace the call's reservation by its real usage (0 for a call that failed).

        `final_refund`: the root's final turn did not go out (handed back, failed): its
        set-aside goes back, so the root gets that turn when it asks again.
        """
        script_keys = [keys.budget(root_trace_id), keys.budget_held(root_trace_id)]
        args: list[str | int] = [trace_id, used_tokens, repr(float(used_usd))]
        args.append("1" if final_refund else "0")
        self._settle(keys=script_keys, args=args)

    def release(self, trace_id: str, root_trace_id: str) -> None:
        """The trace ended: what it still holds goes, and the root's set-aside with the root.

        Idempotent (BUDGET_RELEASE): a settle lost to a failed write is released here.
        """
        kind = "root" if trace_id == root_trace_id else "end"
        self._release_with(trace_id, root_trace_id, kind)

    def rearm(self, root_trace_id: str) -> None:
        """The root is continued: its set-aside final turn is kept again (unless used)."""
        self._release_with(root_trace_id, root_trace_id, "reopen")

    def _release_with(self, trace_id: str, root_trace_id: str, kind: str) -> None:
        script_keys = [keys.budget(root_trace_id), keys.budget_held(root_trace_id)]
        self._release(keys=script_keys, args=[trace_id, kind, repr(FINAL_SHARE)])

    def spawn(self, root_trace_id: str, children: int, depth: int) -> str | None:
        """Count `children` new sub-agents at `depth`; a refusal for the model, or None."""
        if not self.has(root_trace_id):
            return None
        reply = self._spawn(keys=[keys.budget(root_trace_id)], args=[children, depth])
        ok, why, left = int(reply[0]), str(reply[1]), int(reply[2])
        return None if ok else spawn_refusal(why, left, children, depth)

    def deadline_ms(self, root_trace_id: str) -> int | None:
        """When the tree's `wall_s` runs out (ms), if it has one: a wait on a person ends then."""
        value = self._client.hget(keys.budget(root_trace_id), "deadline_ms")
        return None if value is None else int(float(value))

    def state(self, root_trace_id: str) -> BudgetState | None:
        """The tree's budget now, or None if it has none."""
        pipe = self._client.pipeline()
        pipe.hgetall(keys.budget(root_trace_id))
        pipe.hvals(keys.budget_held(root_trace_id))
        data, held = pipe.execute()
        if not data:
            return None
        return state_of(data, held)
