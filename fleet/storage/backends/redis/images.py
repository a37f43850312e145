"""A tree's images on the fleet's Redis (`fleet.storage.images` says how they are kept)."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from fleet.storage import keys
from fleet.storage.image_caps import check_size, over_tree_cap

if TYPE_CHECKING:
    from fleet.storage.backends.redis.store import RedisStore


class RedisImages:
    """Images in the fleet's Redis: one string key per image per tree."""

    def __init__(self, store: RedisStore) -> None:
        """Read and write through `store`'s client."""
        self._client = store.client

    def put(self, root_trace_id: str, digest: str, data: bytes) -> None:  # noqa: D102
        check_size(data)
        key = keys.image(root_trace_id, digest)
        if self._client.expire(key, keys.TRACE_TTL_S):
            return  # stored once; kept as long as the tree
        counter = keys.image_bytes(root_trace_id)
        stored = int(self._client.incrby(counter, len(data)))
        self._client.expire(counter, keys.TRACE_TTL_S)
        if (refused := over_tree_cap(stored)) is not None:
            self._client.decrby(counter, len(data))
            raise refused
        encoded = base64.b64encode(data).decode("ascii")
        if not self._client.set(key, encoded, nx=True, ex=keys.TRACE_TTL_S):
            self._client.decrby(counter, len(data))  # a racing writer stored it first

    def get(self, root_trace_id: str, digest: str) -> bytes | None:  # noqa: D102
        value = self._client.getex(keys.image(root_trace_id, digest), ex=keys.TRACE_TTL_S)
        return None if value is None else base64.b64decode(str(value))
