"""Images of ``image_url`` parts given as data: URLs (tallow.server.images): PNG, JPEG and WebP
decode to the right RGB pixels (transparency as transformers' convert_to_rgb composites it);
bad base64, non-image types, unsupported formats, truncated files, byte and pixel limits are
400s naming the field and the limit."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
from image_samples import data_url, encoded, gradient, png_bomb
from PIL import Image

from tallow.server.errors import APIError
from tallow.server.images import ImagePolicy, decode_image, load_image_url, to_rgb

FIELD = "messages[0].content[1].image_url.url"


def load(url: str, policy: ImagePolicy | None = None) -> Image.Image:
    return asyncio.run(load_image_url(url, policy or ImagePolicy(), param=FIELD))


def refused(url: str, policy: ImagePolicy | None = None) -> APIError:
    with pytest.raises(APIError) as info:
        load(url, policy)
    error = info.value
    assert error.status == 400 and error.param == FIELD, error.body()
    assert FIELD in error.message
    return error


def test_png_decodes_to_its_pixels() -> None:
    source = gradient(13, 7)
    image = load(data_url(encoded(source, "PNG")))
    assert image.mode == "RGB" and image.size == (13, 7)
    assert np.array_equal(np.asarray(image), np.asarray(source))


def test_jpeg_and_webp_decode_close_to_their_pixels() -> None:
    source = gradient(32, 24)
    for fmt, mime in (("JPEG", "image/jpeg"), ("WEBP", "image/webp")):
        image = load(data_url(encoded(source, fmt, quality=95), mime))
        assert image.mode == "RGB" and image.size == (32, 24), fmt
        # lossy formats: equal to what Pillow itself decodes from the same file
        reference = Image.open(__import__("io").BytesIO(encoded(source, fmt, quality=95)))
        assert np.array_equal(np.asarray(image), np.asarray(reference.convert("RGB"))), fmt
    lossless = load(data_url(encoded(source, "WEBP", lossless=True), "image/webp"))
    assert np.array_equal(np.asarray(lossless), np.asarray(source))


def test_image_jpg_is_accepted_as_a_declared_type() -> None:
    assert load(data_url(encoded(gradient(4, 4), "JPEG"), "image/jpg")).size == (4, 4)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L", "1", "I;16", "CMYK", "PT"])
def test_rgb_conversion_matches_transformers_convert_to_rgb(mode: str) -> None:
    from transformers.image_transforms import convert_to_rgb

    base = gradient(9, 6, "RGBA")
    if mode == "PT":  # a palette image with a transparent colour
        image = base.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
        image.info["transparency"] = 3
    elif mode == "CMYK":
        image = base.convert("RGB").convert("CMYK")
    else:
        image = base.convert(mode)
    ours = to_rgb(image)
    theirs = convert_to_rgb(image, return_numpy=True)
    assert ours.mode == "RGB"
    assert np.array_equal(np.asarray(ours), theirs), mode


def test_transparent_png_is_composited_on_white_after_decoding() -> None:
    source = Image.new("RGBA", (3, 2), (200, 10, 10, 0))
    source.putpixel((1, 1), (0, 0, 255, 128))
    image = load(data_url(encoded(source, "PNG")))
    assert image.getpixel((0, 0)) == (255, 255, 255)
    r, g, b = image.getpixel((1, 1))  # half blue over white
    assert (abs(r - 127) <= 1, abs(g - 127) <= 1, b) == (True, True, 255)


def test_bad_base64_is_a_400() -> None:
    error = refused("data:image/png;base64,iVBORw0KGgo!!!not-base64")
    assert "not valid base64" in error.message


@pytest.mark.parametrize("mime", ["text/plain", "application/octet-stream", ""])
def test_a_non_image_type_is_a_400(mime: str) -> None:
    error = refused(f"data:{mime};base64," + data_url(b"hello")[len("data:image/png;base64,") :])
    assert "expected an image type" in error.message


def test_declared_gif_and_unsupported_decoded_formats_are_400s() -> None:
    gif = encoded(gradient(4, 4), "GIF")
    assert "not accepted; send PNG, JPEG or WebP" in refused(data_url(gif, "image/gif")).message
    error = refused(data_url(gif, "image/png"))  # declared PNG, is a GIF
    assert "GIF images are not accepted" in error.message
    bmp = encoded(gradient(4, 4), "BMP")
    assert "BMP images are not accepted" in refused(data_url(bmp)).message
    assert "not an image" in refused(data_url(b"plain text, not an image at all")).message


def test_a_data_url_without_base64_or_comma_is_a_400() -> None:
    assert "base64-encoded" in refused("data:image/png,rawbytes").message
    assert "needs a ','" in refused("data:image/png;base64").message


def test_a_truncated_image_is_a_400() -> None:
    png = encoded(gradient(64, 64), "PNG")
    error = refused(data_url(png[: len(png) // 2]))
    assert "cannot be decoded" in error.message or "cannot be read" in error.message
    jpeg = encoded(gradient(64, 64), "JPEG")
    refused(data_url(jpeg[: len(jpeg) // 3], "image/jpeg"))


def test_a_pixel_bomb_in_a_data_url_is_refused_before_decoding() -> None:
    bomb = png_bomb()
    assert len(bomb) < 2000
    started = time.monotonic()
    error = refused(data_url(bomb))
    assert time.monotonic() - started < 5  # never decoded (4.8 GB of pixels)
    assert "40,000×40,000 = 1,600,000,000 pixels" in error.message
    assert "the limit is 67,108,864" in error.message and "--max-image-pixels" in error.message
    assert error.code == "image_too_large"


def test_the_pixel_limit_is_the_policys() -> None:
    url = data_url(encoded(gradient(20, 10), "PNG"))
    assert load(url, ImagePolicy(max_pixels=200)).size == (20, 10)
    error = refused(url, ImagePolicy(max_pixels=199))
    assert "20×10 = 200 pixels; the limit is 199" in error.message
    assert "server.max_image_pixels" in error.message


def test_the_byte_limit_applies_to_the_decoded_bytes() -> None:
    png = encoded(gradient(40, 40), "PNG")
    assert load(data_url(png), ImagePolicy(max_bytes=len(png))).size == (40, 40)
    error = refused(data_url(png), ImagePolicy(max_bytes=len(png) - 1))
    assert f"is {len(png):,} bytes; the limit is {len(png) - 1:,}" in error.message
    assert "--max-image-bytes" in error.message


def test_a_huge_data_url_is_refused_before_it_is_decoded() -> None:
    policy = ImagePolicy(max_bytes=1000)
    error = refused("data:image/png;base64," + "A" * 100_000, policy)
    assert "is about 75,000 bytes; the limit is 1,000" in error.message
    assert "--max-image-bytes" in error.message


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/a.png", "a.png", "", "   "]
)
def test_other_urls_are_400s(url: str) -> None:
    error = refused(url)
    assert "data: URL" in error.message


def test_decode_image_standalone_and_policy_validation() -> None:
    png = encoded(gradient(5, 5), "PNG")
    assert decode_image(png, ImagePolicy(), "image").size == (5, 5)
    for bad in (
        {"max_bytes": 0},
        {"max_pixels": -1},
        {"timeout_s": 0},
        {"allowed_hosts": ("https://a.com/",)},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ImagePolicy(**bad)  # type: ignore[arg-type]


def test_an_animated_webp_gives_its_first_frame() -> None:
    frames: list[Any] = [Image.new("RGB", (6, 6), c) for c in ((255, 0, 0), (0, 255, 0))]
    data = encoded(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    image = load(data_url(data, "image/webp"))
    assert image.getpixel((2, 2)) == (255, 0, 0)
