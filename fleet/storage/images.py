"""Images stored once per trace tree, by reference: Redis and memory.

A message never holds an image's bytes: its content holds an `image_ref` part naming the
image's digest, and the bytes live here under `keys.image(root, digest)` (base64, at most
`keys.IMAGE_MAX_BYTES` before encoding, with the trace's TTL, refreshed by every read and
write; at most `keys.IMAGE_TREE_MAX_BYTES` per tree). The runner puts them back into the
request it sends (`fleet.loop.images`); task messages, events, Flower, logs and `fleet
trace show` only ever see the reference.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Protocol

from fleet.errors import ToolError
from fleet.storage import keys
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.store import TraceStore

if TYPE_CHECKING:  # redis is imported only by a process that has a Redis store
    from fleet.storage.backends.redis.store import RedisStore


class ImageStore(Protocol):
    """Where a tree's images live."""

    def put(self, root_trace_id: str, digest: str, data: bytes) -> None:
        """Store the image (once: the same digest again only refreshes its TTL).

        Raises:
            ToolError: the tree stored `keys.IMAGE_TREE_MAX_BYTES` of images already.
        """
        ...

    def get(self, root_trace_id: str, digest: str) -> bytes | None:
        """The image's bytes; None once it expired (or was never stored)."""
        ...


def _check_size(data: bytes) -> None:
    if len(data) > keys.IMAGE_MAX_BYTES:
        raise ToolError(f"an image of {len(data)} bytes is over {keys.IMAGE_MAX_BYTES}: refused")


def _over_tree_cap(stored_bytes: int) -> ToolError | None:
    if stored_bytes <= keys.IMAGE_TREE_MAX_BYTES:
        return None
    return ToolError(
        f"this tree stored {keys.IMAGE_TREE_MAX_BYTES} bytes of images already: no more"
    )


class RedisImages:
    """Images in the fleet's Redis: one string key per image per tree."""

    def __init__(self, store: RedisStore) -> None:
        """Read and write through `store`'s client."""
        self._client = store.client

    def put(self, root_trace_id: str, digest: str, data: bytes) -> None:  # noqa: D102
        _check_size(data)
        key = keys.image(root_trace_id, digest)
        if self._client.expire(key, keys.TRACE_TTL_S):
            return  # stored once; kept as long as the tree
        counter = keys.image_bytes(root_trace_id)
        stored = int(self._client.incrby(counter, len(data)))
        self._client.expire(counter, keys.TRACE_TTL_S)
        if (refused := _over_tree_cap(stored)) is not None:
            self._client.decrby(counter, len(data))
            raise refused
        encoded = base64.b64encode(data).decode("ascii")
        if not self._client.set(key, encoded, nx=True, ex=keys.TRACE_TTL_S):
            self._client.decrby(counter, len(data))  # a racing writer stored it first

    def get(self, root_trace_id: str, digest: str) -> bytes | None:  # noqa: D102
        value = self._client.getex(keys.image(root_trace_id, digest), ex=keys.TRACE_TTL_S)
        return None if value is None else base64.b64decode(str(value))


class MemoryImages:
    """The same in an in-process store (tests, `--inline`); no TTL."""

    def __init__(self, store: MemoryStore) -> None:
        """Keep images in `store`'s own table (shared by its fenced views)."""
        self._table = store.images

    def put(self, root_trace_id: str, digest: str, data: bytes) -> None:  # noqa: D102
        _check_size(data)
        key = keys.image(root_trace_id, digest)
        if key in self._table:
            return
        counter = keys.image_bytes(root_trace_id)
        stored = int(self._table.get(counter, "0")) + len(data)
        if (refused := _over_tree_cap(stored)) is not None:
            raise refused
        self._table[counter] = str(stored)
        self._table[key] = base64.b64encode(data).decode("ascii")

    def get(self, root_trace_id: str, digest: str) -> bytes | None:  # noqa: D102
        value = self._table.get(keys.image(root_trace_id, digest))
        return None if value is None else base64.b64decode(value)


def image_store(store: TraceStore) -> ImageStore:
    """The image store beside this trace store."""
    from fleet.storage.backends.redis.store import RedisStore

    if isinstance(store, RedisStore):
        return RedisImages(store)
    if isinstance(store, MemoryStore):
        return MemoryImages(store)
    raise TypeError(f"no image store for {type(store).__name__}")
