"""What an image is, read from its first bytes: type by magic number, size from its header.

An image is attacker-controlled (a file in the workspace, a URL, a batch entry). Nothing
here decodes pixels: the type comes from the magic bytes (never the name), the width and
height from the header, and a file whose header says more than `MAX_PIXELS` is refused
before anything could decompress it, so a decompression bomb (a few KB declaring
100,000 x 100,000 pixels) never reaches a decoder here or at the provider. PNG, JPEG, GIF
and WebP are accepted: the four types both providers take.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from fleet.errors import ToolError

MAX_IMAGE_BYTES = 5_000_000
"""Largest image accepted (Anthropic's own per-image limit; OpenAI's is higher)."""
MAX_SIDE_PX = 8_000
"""Longest side accepted (Anthropic refuses more)."""
MAX_PIXELS = 40_000_000
"""Width x height accepted: a bomb declares far more than its bytes could hold."""
MAX_GIF_FRAMES = 1_000
"""Frames a GIF may have: each one is decoded by whoever shows it."""
MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")

_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
"""JPEG start-of-frame markers (0xC4 DHT, 0xC8 JPG, 0xCC DAC are not frames)."""
_JPEG_SCAN_BYTES = 1_000_000
"""A JPEG's frame header comes after its metadata segments; no further than this is read."""


@dataclass(frozen=True)
class ImageInfo:
    """What an image's header says, checked against the limits."""

    media_type: str
    width: int
    height: int
    size_bytes: int

    @property
    def kind(self) -> str:
        """`PNG`, `JPEG`, `GIF` or `WEBP`."""
        return self.media_type.removeprefix("image/").upper()


@dataclass(frozen=True)
class Image:
    """An image's bytes with what was checked about them."""

    data: bytes
    info: ImageInfo

    @property
    def digest(self) -> str:
        """Its name in the store: the same bytes are stored once per tree."""
        return hashlib.sha256(self.data).hexdigest()[:32]

    def ref(self) -> dict[str, Any]:
        """The `image_ref` content part a message holds in place of the bytes."""
        info = self.info
        ref = {"id": self.digest, "media_type": info.media_type, "bytes": info.size_bytes}
        ref |= {"width": info.width, "height": info.height}
        return {"type": "image_ref", "image_ref": ref}

    def describe(self, name: str) -> str:
        """One line for the model and for people: `shot.png: PNG 800x600, 12.3 KB`."""
        info = self.info
        return f"{name}: {info.kind} {info.width}x{info.height}, {info.size_bytes / 1000:.1f} KB"


def checked(data: bytes, name: str) -> Image:
    """The image, or `ToolError` naming `name` and what is wrong with it.

    Refused: more than MAX_IMAGE_BYTES, a type other than PNG/JPEG/GIF/WebP (whatever
    the name says), a header that is cut or says zero pixels, more than MAX_SIDE_PX on a
    side or MAX_PIXELS in all.
    """
    if len(data) > MAX_IMAGE_BYTES:
        raise ToolError(f"{name}: larger than {MAX_IMAGE_BYTES} bytes: refused")
    try:
        media_type, width, height = _header(data)
    except (struct.error, IndexError):
        raise ToolError(f"{name}: the image header is cut short: refused") from None
    if media_type is None:
        raise ToolError(f"{name}: not a PNG, JPEG, GIF or WebP image (by its content): refused")
    if width <= 0 or height <= 0:
        raise ToolError(f"{name}: the header says {width}x{height} pixels: refused")
    if max(width, height) > MAX_SIDE_PX or width * height > MAX_PIXELS:
        raise ToolError(
            f"{name}: {width}x{height} pixels is more than the limit"
            f" ({MAX_SIDE_PX} px a side, {MAX_PIXELS} pixels): refused"
        )
    return Image(data, ImageInfo(media_type, width, height, len(data)))


def _header(data: bytes) -> tuple[str | None, int, int]:
    """(media type, width, height) from the magic bytes and header; (None, 0, 0) if unknown."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if data[12:16] != b"IHDR":
            return "image/png", 0, 0
        width, height = struct.unpack(">II", data[16:24])
        return "image/png", width, height
    if data[:6] in (b"GIF87a", b"GIF89a"):
        width, height = struct.unpack("<HH", data[6:10])
        return "image/gif", *_gif_size(data, width, height)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ("image/webp", *_webp_size(data))
    if data.startswith(b"\xff\xd8\xff"):
        return ("image/jpeg", *_jpeg_size(data))
    return None, 0, 0


def _gif_size(data: bytes, width: int, height: int) -> tuple[int, int]:
    """The size a decoder would allocate: the screen, or a larger frame (each one walked).

    A GIF's frames may claim more than its logical screen; every image descriptor is read
    (its data sub-blocks skipped unread), so a 1 x 1 screen with a 65535 x 65535 frame is
    seen as what it is. More than MAX_GIF_FRAMES frames counts as a bomb too.
    """
    at, frames = 13 + _table_bytes(data[10]), 0
    while at < len(data) and data[at] != 0x3B:  # the trailer
        if data[at] == 0x21:  # an extension: label, then sub-blocks
            at = _skip_blocks(data, at + 2)
        elif data[at] == 0x2C:  # an image descriptor
            left, top, w, h = struct.unpack("<HHHH", data[at + 1 : at + 9])
            width, height = max(width, left + w), max(height, top + h)
            frames += 1
            if frames > MAX_GIF_FRAMES:
                return MAX_SIDE_PX + 1, MAX_SIDE_PX + 1
            at = _skip_blocks(data, at + 10 + _table_bytes(data[at + 9]) + 1)  # + LZW size
        else:
            return 0, 0
    return width, height


def _table_bytes(flags: int) -> int:
    """Bytes of the colour table a GIF flags byte announces (none without its top bit)."""
    return 3 * (2 ** ((flags & 0x07) + 1)) if flags & 0x80 else 0


def _skip_blocks(data: bytes, at: int) -> int:
    """Past a run of GIF data sub-blocks (each a length byte, 0 ends the run)."""
    while at < len(data) and data[at] != 0:
        at += data[at] + 1
    return at + 1


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8X":  # extended: 24-bit canvas width-1 and height-1
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if chunk == b"VP8L":  # lossless: signature 0x2f, then 14 bits each of width-1, height-1
        if data[20] != 0x2F:
            return 0, 0
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":  # lossy: key frame start code, then 14-bit width and height
        if data[23:26] != b"\x9d\x01\x2a":
            return 0, 0
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return 0, 0


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """The first start-of-frame segment's size; segments are walked, never decoded."""
    at, end = 2, min(len(data), _JPEG_SCAN_BYTES)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return 0, 0
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        if length < 2 or marker == 0xD9:
            return 0, 0
        at += 2 + length
    return 0, 0


class TreeImages(Protocol):
    """Where a tree's images are kept, as a tool stores one (`Runtime.images` hands it).

    A role, not the storage package: no tool imports `fleet.storage`.
    """

    def put(self, root_trace_id: str, digest: str, data: bytes) -> None:
        """Store the image once per tree; `ToolError` when the tree holds too much already."""
        ...


def stored_ref(images: TreeImages, root_trace_id: str, image: Image) -> dict[str, Any]:
    """Store the image for the tree (once) and return the part a message holds instead."""
    images.put(root_trace_id, image.digest, image.data)
    return image.ref()
