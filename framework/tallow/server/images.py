"""Images of chat requests: ``image_url`` parts to PIL images, within the server's limits.

This version reads ``data:`` URLs only (base64 PNG, JPEG or WebP, decoded with Pillow); any
other URL is refused with a 400 naming the parameter. :class:`ImagePolicy` holds the limits
that apply to every image (and the hosts http(s) URLs may come from, where a fetcher serves
them).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tallow.engine.multimodal import decode_data_url

from .errors import invalid

if TYPE_CHECKING:  # pragma: no cover
    import PIL.Image

__all__ = ["ImagePolicy", "load_image_url"]

_FORMATS = ("PNG", "JPEG", "WEBP")


@dataclass(frozen=True)
class ImagePolicy:
    """What the server accepts as an image."""

    #: hosts http(s) URLs may name; empty: http(s) URLs are refused
    allowed_hosts: tuple[str, ...] = ()
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 8192 * 8192
    timeout_s: float = 10.0


async def load_image_url(url: str, policy: ImagePolicy, *, param: str) -> "PIL.Image.Image":
    """The image of ``url`` (a ``data:`` URL), decoded; a 400 naming ``param`` when it is not
    one, is not a PNG/JPEG/WebP, or exceeds ``policy``'s byte or pixel limit."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(url, str) or not url.startswith("data:"):
        raise invalid(param, f"Invalid value for {param!r}: only data: URLs "
                      "(data:image/png;base64,...) are accepted by this server.")
    # a base64 payload is 4/3 of its bytes: refuse an oversized one before decoding it
    if len(url) > policy.max_bytes * 4 // 3 + 1024:
        raise invalid(param, f"Invalid value for {param!r}: the image exceeds the limit of "
                      f"{policy.max_bytes} bytes.")
    try:
        data = decode_data_url(url, param)
    except ValueError as exc:
        raise invalid(param, f"Invalid value for {exc}.") from None
    if len(data) > policy.max_bytes:
        raise invalid(param, f"Invalid value for {param!r}: the image exceeds the limit of "
                      f"{policy.max_bytes} bytes.")
    try:
        image = Image.open(io.BytesIO(data), formats=_FORMATS)
        width, height = image.size
        if width * height > policy.max_pixels:
            raise invalid(param, f"Invalid value for {param!r}: the image has {width}x{height} "
                          f"pixels, more than the limit of {policy.max_pixels}.")
        image.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise invalid(param, f"Invalid value for {param!r}: not a PNG, JPEG or WebP image "
                      f"({exc}).") from None
    return image
