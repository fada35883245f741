"""Images of ``image_url`` content parts: data: URLs and allow-listed http(s) URLs, decoded with
Pillow within the operator's limits.

:func:`load_image_url` is the one entry point: it turns the ``url`` of an ``image_url`` part
into an RGB ``PIL.Image.Image``, or raises a 400 :class:`~tallow.server.errors.APIError`
that names the request field and the limit or setting at fault.

- ``data:image/png|jpeg|webp;base64,...`` is decoded in place. The declared type must be an
  image type; the decoded file must be PNG, JPEG or WebP (GIF, BMP and the rest are refused).
- ``http://`` and ``https://`` URLs are fetched only from the hosts the operator allows
  (:mod:`tallow.server.image_fetch` has the rules); with no allowed host every link is refused.
- Every image is limited twice before its pixels are decoded: its size in bytes
  (``max_bytes``, after base64 decoding for a data: URL) and the width × height its header
  declares (``max_pixels``), so neither a huge body nor a small file that declares a huge
  canvas (a decompression bomb) costs memory.
- The decoded image is converted to RGB the way transformers' ``convert_to_rgb`` does it: an
  image with transparency (an alpha band, or a palette/greyscale image with a transparent
  colour) is composited onto white; any other mode is simply converted. An animated WebP gives
  its first frame.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import TYPE_CHECKING

from .errors import invalid
from .image_policy import PIXELS_SETTING, ImagePolicy, policy_from_config, too_many_bytes

__all__ = [
    "ImagePolicy",
    "decode_data_url",
    "decode_image",
    "load_image_url",
    "policy_from_config",
    "to_rgb",
]

if TYPE_CHECKING:
    from PIL import Image as PILImage

#: the file formats accepted, as Pillow names them (Pillow's format → the MIME subtype)
FORMATS: dict[str, str] = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}
#: the MIME types a data: URL may declare
DATA_MIME_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp")


async def load_image_url(url: str, policy: ImagePolicy, *, param: str) -> PILImage.Image:
    """The RGB image that ``url`` (a data: URL, or an http(s) URL from an allowed host) holds.

    ``param`` names the request field in errors (``messages[0].content[1].image_url.url``);
    every refusal is a 400 naming the limit or setting at fault. Decoding runs in a worker
    thread so a large image does not hold up the event loop.
    """
    import anyio

    if not isinstance(url, str) or not url.strip():
        raise invalid(
            param,
            f"Invalid value for {param!r}: expected an image URL (a data: URL or an http(s) link).",
        )
    url = url.strip()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        # base64 decoding of a large URL is work too: both steps run in the worker thread
        return await anyio.to_thread.run_sync(
            lambda: decode_image(decode_data_url(url, policy, param=param), policy, param)
        )
    if scheme not in ("http", "https"):
        shown = f"{scheme!r} URLs" if scheme else "URLs without a scheme"
        raise invalid(
            param,
            f"Invalid value for {param!r}: {shown} are not accepted; send the "
            "image as a data: URL (data:image/png;base64,...) or an http(s) link.",
            code="invalid_image_url",
        )
    from .image_fetch import fetch_image

    data = await fetch_image(url, policy, param=param)
    return await anyio.to_thread.run_sync(decode_image, data, policy, param)


def decode_data_url(url: str, policy: ImagePolicy, *, param: str) -> bytes:
    """The bytes of a ``data:image/...;base64,...`` URL (400s for any other shape, a non-image
    type, bad base64, or more than ``max_bytes`` once decoded)."""
    header, comma, payload = url.partition(",")
    if not comma:
        raise invalid(
            param,
            f"Invalid value for {param!r}: a data: URL needs a ',' between its "
            "header and its data (data:image/png;base64,...).",
            code="invalid_image_url",
        )
    fields = [f.strip().lower() for f in header[len("data:") :].split(";")]
    mime = fields[0]
    if not mime.startswith("image/"):
        raise invalid(
            param,
            f"Invalid value for {param!r}: the data: URL declares the type "
            f"{mime or '(none)'!r}; expected an image type (" + ", ".join(DATA_MIME_TYPES) + ").",
            code="invalid_image_url",
        )
    if mime not in DATA_MIME_TYPES:
        raise invalid(
            param,
            f"Invalid value for {param!r}: images of type {mime!r} are not "
            "accepted; send PNG, JPEG or WebP.",
            code="unsupported_image_format",
        )
    if "base64" not in fields[1:]:
        raise invalid(
            param,
            f"Invalid value for {param!r}: the data: URL must be base64-encoded "
            f"(data:{mime};base64,...).",
            code="invalid_image_url",
        )
    # base64 takes 4 characters for 3 bytes: an encoded text this long cannot fit the limit
    # (whitespace aside), and is refused before it is decoded
    if len(payload) > (policy.max_bytes + 2) // 3 * 4 + 4096:
        raise too_many_bytes(param, len(payload) * 3 // 4, policy, about=True)
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(
            param,
            f"Invalid value for {param!r}: the data: URL's data is not valid base64 ({exc}).",
            code="invalid_image_url",
        ) from None
    if len(data) > policy.max_bytes:
        raise too_many_bytes(param, len(data), policy)
    if not data:
        raise invalid(
            param,
            f"Invalid value for {param!r}: the data: URL holds no data.",
            code="invalid_image_url",
        )
    return data


def _open_header(data: bytes, param: str) -> PILImage.Image:
    """The image of ``data`` opened lazily (only its header read) by the plugin of one of
    :data:`FORMATS`; a 400 when none of them recognises it."""
    from PIL import Image, JpegImagePlugin, PngImagePlugin, WebPImagePlugin  # noqa: F401

    # each plugin's factory is called directly: Image.open would apply Pillow's own
    # decompression-bomb check (a process-wide setting) before this module's limit
    prefix = data[:16]
    for fmt in FORMATS:
        factory, accept = Image.OPEN[fmt]
        if accept is not None and not accept(prefix):
            continue
        try:
            return factory(io.BytesIO(data), "")
        except (SyntaxError, OSError, ValueError, IndexError, EOFError) as exc:
            raise invalid(
                param,
                f"Invalid value for {param!r}: the {fmt} image cannot be read "
                f"({exc or type(exc).__name__}).",
                code="invalid_image",
            ) from None
    what = _sniff(data)
    raise invalid(
        param,
        f"Invalid value for {param!r}: "
        + (
            f"{what} images are not accepted"
            if what
            else "the data is not an image Pillow recognises"
        )
        + "; send PNG, JPEG or WebP.",
        code="unsupported_image_format",
    )


def _sniff(data: bytes) -> str:
    """The name of a common image format ``data`` starts like (for error messages), or ''."""
    for magic, name in (
        (b"GIF8", "GIF"),
        (b"BM", "BMP"),
        (b"II*\0", "TIFF"),
        (b"MM\0*", "TIFF"),
        (b"\0\0\1\0", "ICO"),
        (b"<svg", "SVG"),
        (b"<?xml", "SVG"),
    ):
        if data.startswith(magic):
            return name
    if data[4:12] in (b"ftypavif", b"ftypheic", b"ftypheix", b"ftypmif1"):
        return "AVIF/HEIC"
    return ""


def to_rgb(image: PILImage.Image) -> PILImage.Image:
    """``image`` in mode RGB: transparency composited onto white, as transformers'
    ``convert_to_rgb`` does; other modes converted."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def decode_image(data: bytes, policy: ImagePolicy, param: str) -> PILImage.Image:
    """The RGB image of the PNG, JPEG or WebP file ``data``: its header's width × height is
    checked against ``max_pixels`` before any pixel is decoded; a truncated or corrupt file,
    or one Pillow refuses as a decompression bomb, is a 400 naming ``param``."""
    from PIL import Image

    if len(data) > policy.max_bytes:
        raise too_many_bytes(param, len(data), policy)
    with warnings.catch_warnings():
        # Pillow's own bomb warning, should any step raise it, refuses the image too
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = _open_header(data, param)
            width, height = image.size
            if width <= 0 or height <= 0:
                raise invalid(
                    param,
                    f"Invalid value for {param!r}: the image declares a size of {width}×{height}.",
                    code="invalid_image",
                )
            if width * height > policy.max_pixels:
                raise invalid(
                    param,
                    f"The image at {param!r} is {width:,}×{height:,} = "
                    f"{width * height:,} pixels; the limit is {policy.max_pixels:,} "
                    f"({PIXELS_SETTING}).",
                    code="image_too_large",
                )
            if getattr(image, "n_frames", 1) > 1:
                image.seek(0)
            image.load()
            return to_rgb(image)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise invalid(
                param,
                f"The image at {param!r} was refused as a decompression "
                f"bomb ({exc}); the limit is {policy.max_pixels:,} pixels "
                f"({PIXELS_SETTING}).",
                code="image_too_large",
            ) from None
        except (SyntaxError, OSError, ValueError, IndexError, EOFError) as exc:
            raise invalid(
                param,
                f"Invalid value for {param!r}: the image cannot be decoded: "
                f"{exc or type(exc).__name__} (a truncated or corrupt file?).",
                code="invalid_image",
            ) from None
