"""Images stored once per trace tree, by reference: Redis and memory.

A message never holds an image's bytes: its content holds an `image_ref` part naming the
image's digest, and the bytes live here under `keys.image(root, digest)` (base64, at most
`keys.IMAGE_MAX_BYTES` before encoding, with the trace's TTL, refreshed by every read and
write; at most `keys.IMAGE_TREE_MAX_BYTES` per tree). The runner puts them back into the
request it sends (`fleet.loop.images`); task messages, events, Flower, logs and `fleet
trace show` only ever see the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # redis is imported only by a process that has a Redis store
    from fleet.storage.store import TraceStore


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


def image_store(store: TraceStore) -> ImageStore:
    """The image store beside this trace store."""
    from fleet.storage.backends.memory.images import MemoryImages
    from fleet.storage.backends.memory.store import MemoryStore
    from fleet.storage.backends.redis.images import RedisImages
    from fleet.storage.backends.redis.store import RedisStore

    if isinstance(store, RedisStore):
        return RedisImages(store)
    if isinstance(store, MemoryStore):
        return MemoryImages(store)
    raise TypeError(f"no image store for {type(store).__name__}")
