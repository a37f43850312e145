"""A finished trace packed into one compressed value, and back: the pure half of compaction.

A finished trace's hash (its ~30 fields and every message, each a field of its own) costs
Redis a hashtable entry per field; packed, the same hash is one field, `PACKED_FIELD`,
holding the fields as one JSON object, zlib-compressed and base64-encoded (the store's
client decodes every reply as text). Readers unpack it wherever they read a trace hash
(`unpacked`); a field written after packing (a stop flag) wins over the packed one.

The traces of one tree are alike (the same system prompt, tools, ids, field names), so each
is compressed against the tree's *dictionary* (`TreeDict`: one sibling's fields, kept once
per tree in `keys.tree_dict`): a branch of ~3.5 KB packs to ~150 bytes instead of ~1 KB.
Version `1:` values need no dictionary; `2:{root}:{digest}:` values name theirs.

The Redis half (the scripts, which tree to pack, thawing before a write) is
`fleet.storage.backends.redis.compact`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

PACKED_FIELD = "z"
"""The one field of a packed trace hash (not a Trace attribute, not a message)."""
PACK_VERSION = "1:"
"""The prefix of a value packed alone (zlib level 9, base64)."""
DICT_VERSION = "2:"
"""The prefix of a value packed against its tree's dictionary: `2:{root}:{digest}:{base64}`."""
DICT_MAX_BYTES = 32 * 1024
"""zlib reads at most the last 32 KiB of a dictionary."""


@dataclass(frozen=True)
class TreeDict:
    """The text a tree's traces are compressed against, named by its root and digest."""

    root_trace_id: str
    data: bytes

    @property
    def ref(self) -> str:
        """`{root}:{digest}`, written into every value packed against it."""
        return f"{self.root_trace_id}:{hashlib.sha1(self.data).hexdigest()[:12]}"

    @classmethod
    def of(cls, root_trace_id: str, sample: Mapping[str, str]) -> TreeDict:
        """A dictionary made of one trace of the tree (its fields as `pack` writes them)."""
        return cls(root_trace_id, _text(sample)[-DICT_MAX_BYTES:])


DictLookup = Callable[[str], "TreeDict | None"]
"""A tree's dictionary by its root id (None: gone); the caller checks the digest."""


class PackError(ValueError):
    """A packed value that does not unpack (corrupt, or packed by a newer fleet)."""


def _text(data: Mapping[str, str]) -> bytes:
    return json.dumps(dict(data), separators=(",", ":"), ensure_ascii=False).encode()


def pack(data: Mapping[str, str], tree_dict: TreeDict | None = None) -> str:
    """The hash's fields (a trace hash as HGETALL reads it) as one packed value."""
    if tree_dict is None:
        return PACK_VERSION + _b64(zlib.compress(_text(data), 9))
    packer = zlib.compressobj(9, zdict=tree_dict.data)
    body = packer.compress(_text(data)) + packer.flush()
    return f"{DICT_VERSION}{tree_dict.ref}:{_b64(body)}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def dict_root(value: str) -> str | None:
    """The root whose dictionary a packed value needs, None if it needs none."""
    if not value.startswith(DICT_VERSION):
        return None
    return value[len(DICT_VERSION) :].split(":", 1)[0]


def unpack(value: str, dicts: DictLookup | None = None) -> dict[str, str]:
    """The fields `pack` packed; `PackError` for anything else (or a dictionary gone)."""
    try:
        if value.startswith(PACK_VERSION):
            text = zlib.decompress(base64.b64decode(value[len(PACK_VERSION) :]))
        elif value.startswith(DICT_VERSION):
            text = _inflate(value, dicts)
        else:
            raise PackError(f"packed trace value of an unknown version {value[:8]!r}")
        fields = json.loads(text)
    except (binascii.Error, zlib.error, ValueError) as exc:
        if isinstance(exc, PackError):
            raise
        raise PackError(f"packed trace value does not unpack: {exc}") from None
    if not isinstance(fields, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in fields.items()
    ):
        raise PackError("packed trace value is not a hash of text fields")
    return fields


def _inflate(value: str, dicts: DictLookup | None) -> bytes:
    root, digest_, body = value[len(DICT_VERSION) :].split(":", 2)
    found = dicts(root) if dicts is not None else None
    if found is None or found.ref != f"{root}:{digest_}":
        raise PackError(f"the compaction dictionary of tree {root[:60]!r} is gone")
    unpacker = zlib.decompressobj(zdict=found.data)
    return unpacker.decompress(base64.b64decode(body)) + unpacker.flush()


def unpacked(data: Mapping[str, str], dicts: DictLookup | None = None) -> dict[str, str]:
    """A trace hash as read, with its packed field (if any) spread back into fields."""
    if PACKED_FIELD not in data:
        return dict(data)
    fields = unpack(data[PACKED_FIELD], dicts)
    fields.update((k, v) for k, v in data.items() if k != PACKED_FIELD)
    return fields


def digest(data: Mapping[str, str]) -> str:
    """The hash as the pack scripts of `redis_compact` dump it: sorted `name NUL value NUL`.

    A script replaces the hash only if it still dumps to this: a write that landed between
    the read and the pack leaves the hash as it is (packed at the next check). Sent whole,
    not hashed: fakeredis's Lua has no `redis.sha1hex`, and compaction runs once per tree.
    """
    return "".join(f"{name}\0{data[name]}\0" for name in sorted(data, key=lambda n: n.encode()))
