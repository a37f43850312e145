"""`fleet migrate`, second step: the run state an earlier release kept in `trace.metadata`.

Releases before the run state (`fleet.runstate`) kept the fleet's own state of a run in the
trace's metadata (`waiting_on`, `approved_call`, `waiting_on_batch`, `turn`, `stop_reason`,
...). This release reads it only from the trace hash's `r:{name}` fields, so a trace left
mid-way by the old workers (a question waiting for its person, a call parked on a provider
batch, a continued root's turn) would forget where it was. Each trace hash without
`r:schema_version` gets every key of its metadata that is a run-state field and validates
as one copied to that field, and `r:schema_version` 0 ("lifted from an earlier release"),
in one script; its metadata is left as it is (the fleet no longer reads it).

A packed (compacted) trace ended with its tree and is left as it is: it reads with a default
run state (no stop reason shown). The cluster layout (`FLEET_REDIS_CLUSTER=1`) is not
scanned. Run it with the workers stopped, as the layout move: a second run lifts nothing
twice (a lifted hash has its `r:schema_version`).
"""

from __future__ import annotations

import json
from typing import Any

import redis

from fleet.errors import InvalidTraceId
from fleet.ids import check_trace_id
from fleet.runstate import RunPatch, check_patch
from fleet.storage import keys
from fleet.storage.compaction import PACKED_FIELD

LIFTED_VERSION = 0
"""The `schema_version` of a run state lifted from an earlier release's metadata."""
SCAN_COUNT = 1000

# KEYS: the trace hash. ARGV: its metadata as read, then field/value items to set.
# Returns 1 when lifted, 0 when it has a run state already, -1 when its metadata changed.
LIFT = """
if redis.call('HEXISTS', KEYS[1], 'r:schema_version') == 1 then return 0 end
if redis.call('HGET', KEYS[1], 'metadata') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""


def lifted_fields(metadata: dict[str, Any]) -> list[str]:
    """The run-state fields of an old trace's metadata as HSET items (the rest left out)."""
    items = [keys.RUN_FIELD + "schema_version", str(LIFTED_VERSION)]
    for name in RunPatch.__optional_keys__ & metadata.keys():
        try:
            (value,) = check_patch({name: metadata[name]}).values()
        except ValueError:
            continue  # not the fleet's value (a caller's key of the same name): left out
        items += [keys.RUN_FIELD + name, json.dumps(value, ensure_ascii=False)]
    return items


def migrate_run_state(client: redis.Redis, dry_run: bool = False) -> int:
    """Lift the run state of every trace an earlier release wrote; how many were (or would be)."""
    lift = client.register_script(LIFT)
    prefix = f"{keys.PREFIX}:trace:"
    lifted = 0
    for key in client.scan_iter(match=f"{prefix}*", count=SCAN_COUNT):
        try:
            check_trace_id(key.removeprefix(prefix))
        except InvalidTraceId:
            continue  # a trace's other keys (collaborators, events, ...)
        version, packed, metadata = client.hmget(
            key, [keys.RUN_FIELD + "schema_version", PACKED_FIELD, "metadata"]
        )
        if version is not None or packed is not None or metadata is None:
            continue
        fields = json.loads(metadata)
        if not isinstance(fields, dict):
            continue
        if dry_run:
            lifted += 1
            continue
        lifted += int(lift(keys=[key], args=[metadata, *lifted_fields(fields)])) == 1
    return lifted
