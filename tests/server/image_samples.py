"""Image files of the image-input tests: real ones written by Pillow, and a PNG whose header
declares a huge canvas over a few bytes of data (a decompression bomb, never allocated)."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def gradient(width: int, height: int, mode: str = "RGB") -> Image.Image:
    """A ``width`` × ``height`` image whose pixels differ (so a decoding mistake shows)."""
    image = Image.new("RGBA", (width, height))
    image.putdata(
        [
            ((x * 37) % 256, (y * 53) % 256, (x * y) % 256, (x * 11 + y * 7) % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    return image if mode == "RGBA" else image.convert(mode)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (
        struct.pack(">I", len(body))
        + kind
        + body
        + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    )


def png_bomb(width: int = 40_000, height: int = 40_000) -> bytes:
    """A PNG whose IHDR declares ``width`` × ``height`` RGB pixels, followed by one row of
    zeros compressed: a few hundred bytes that would decode to width × height × 3 bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * (1 + 3 * width), 9)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
