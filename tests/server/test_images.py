"""``load_image_url``: data: URLs of PNG, JPEG and WebP images decode; other URLs, other
payloads and images over the policy's byte or pixel limits are 400s naming the parameter."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest

from tallow.server.errors import APIError
from tallow.server.images import ImagePolicy, load_image_url

PARAM = "messages[0].content[1].image_url.url"


def _url(fmt: str, size: tuple[int, int] = (5, 4), mime: str | None = None) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buf, format=fmt)
    return f"data:image/{mime or fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def _load(url: str, policy: ImagePolicy = ImagePolicy()):
    return asyncio.run(load_image_url(url, policy, param=PARAM))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_data_urls_decode(fmt) -> None:
    assert _load(_url(fmt)).size == (5, 4)


@pytest.mark.parametrize("url,policy,needle", [
    ("http://example.com/a.png", ImagePolicy(), "only data: URLs"),
    ("file:///etc/passwd", ImagePolicy(), "only data: URLs"),
    ("data:image/png;base64,%%%", ImagePolicy(), "not valid base64"),
    ("data:image/gif;base64," + base64.b64encode(b"GIF89a....").decode(), ImagePolicy(),
     "not a PNG, JPEG or WebP"),
    (_url("PNG", (64, 64)), ImagePolicy(max_bytes=50), "limit of 50 bytes"),
    (_url("PNG", (64, 64)), ImagePolicy(max_pixels=1000), "more than the limit of 1000"),
])
def test_refusals_name_the_parameter(url, policy, needle) -> None:
    with pytest.raises(APIError) as err:
        _load(url, policy)
    assert err.value.status == 400 and err.value.param == PARAM
    assert needle in str(err.value)
