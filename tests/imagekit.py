"""Small real images, built byte by byte (no imaging library), and hostile look-alikes."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from fleet.models import Trace
from fleet.observe.hooks import Hooks


def png(width: int = 4, height: int = 3) -> bytes:
    """A valid RGB PNG of this size (every pixel black)."""
    raw = b"".join(b"\x00" + b"\x00" * (3 * width) for _ in range(height))
    return _png(width, height, zlib.compress(raw))


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A few hundred bytes whose header declares `width` x `height` pixels.

    The IDAT is a short deflate stream of zeros: a decoder that trusted the header would
    allocate and inflate width x height x 3 bytes.
    """
    return _png(width, height, zlib.compress(b"\x00" * 50_000, 9))


def _png(width: int, height: int, idat: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def gif(
    width: int = 5, height: int = 7, frame: tuple[int, int] | None = None, frames: int = 1
) -> bytes:
    """A GIF89a: a global 2-colour table, `frames` image descriptors of `frame` size (the
    screen's by default) each with a one-byte LZW stream, and the trailer."""
    fw, fh = frame or (width, height)
    head = (
        b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    )
    control = b"\x21\xf9\x04\x00\x00\x00\x00\x00"  # a graphic control extension
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, fw, fh, 0) + b"\x02\x02\x44\x01\x00"
    return head + (control + image) * frames + b";"


def jpeg(width: int = 640, height: int = 480) -> bytes:
    """SOI, an APP0 (JFIF) segment, a SOF0 frame header, EOI."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def webp_lossless(width: int = 9, height: int = 2) -> bytes:
    """A RIFF/WEBP container with a VP8L header of this size."""
    bits = (width - 1) | ((height - 1) << 14)
    body = b"\x2f" + bits.to_bytes(4, "little") + b"\x00" * 8
    chunk = b"VP8L" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def webp_extended(width: int = 3000, height: int = 2000) -> bytes:
    """A RIFF/WEBP container with a VP8X header of this canvas size."""
    body = b"\x00" * 4 + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    chunk = b"VP8X" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


class Requests(Hooks):
    """An operator hook keeping what every model request showed it."""

    def __init__(self) -> None:
        self.shown: list[list[dict[str, Any]]] = []

    def model_requested(self, trace: Trace, model: str, messages: list[dict[str, Any]]) -> None:
        self.shown.append(messages)


REQUESTS = Requests()
"""Loaded as `FLEET_HOOKS=tests.imagekit:REQUESTS`."""
