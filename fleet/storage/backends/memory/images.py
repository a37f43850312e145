"""A tree's images in an in-process store (`fleet.storage.images` says how they are kept)."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from fleet.storage import keys
from fleet.storage.image_caps import check_size, over_tree_cap

if TYPE_CHECKING:
    from fleet.storage.backends.memory.store import MemoryStore


class MemoryImages:
    """The same in an in-process store (tests, `--inline`); no TTL."""

    def __init__(self, store: MemoryStore) -> None:
        """Keep images in `store`'s own table (shared by its fenced views)."""
        self._table = store.images

    def put(self, root_trace_id: str, digest: str, data: bytes) -> None:  # noqa: D102
        check_size(data)
        key = keys.image(root_trace_id, digest)
        if key in self._table:
            return
        counter = keys.image_bytes(root_trace_id)
        stored = int(self._table.get(counter, "0")) + len(data)
        if (refused := over_tree_cap(stored)) is not None:
            raise refused
        self._table[counter] = str(stored)
        self._table[key] = base64.b64encode(data).decode("ascii")

    def get(self, root_trace_id: str, digest: str) -> bytes | None:  # noqa: D102
        value = self._table.get(keys.image(root_trace_id, digest))
        return None if value is None else base64.b64decode(value)
