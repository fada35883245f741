"""The engine's image bookkeeping without a model: the encoder cache's budget and counters,
prefix-cache keys of blocks holding image tokens, positions past the prompt, data: URLs and
chat image parts."""

from __future__ import annotations

import base64
import io

import pytest
import torch

from tallow.engine.block_manager import chain_hash
from tallow.engine.encoder_cache import EncoderCache
from tallow.engine.multimodal import (
    MultimodalPrompt,
    PromptImage,
    chat_images,
    decode_data_url,
    image_digest,
    load_image,
)
from tallow.layers import PlacedImage, ProcessedImage


def _prompt_image(digest: bytes, offset: int, tokens: int) -> PromptImage:
    processed = ProcessedImage(torch.zeros(1), (1, 2, 2), tokens)
    return PromptImage(digest, PlacedImage(offset, processed))


def test_encoder_cache_evicts_least_recently_used_within_its_budget() -> None:
    cache = EncoderCache(budget_bytes=3 * 400)  # three [10, 10] float32 tensors
    for key in (b"a", b"b", b"c"):
        cache.put(key, torch.zeros(10, 10))
    assert cache.get(b"a") is not None  # a is now the most recent
    cache.put(b"d", torch.zeros(10, 10))
    assert cache.get(b"b") is None and cache.get(b"a") is not None
    assert cache.used_bytes == 1200 and len(cache) == 3
    assert cache.stats.evictions == 1 and cache.stats.hits == 2 and cache.stats.misses == 1
    cache.put(b"huge", torch.zeros(100, 100))  # larger than the budget: not kept
    assert cache.get(b"huge") is None and len(cache) == 3


def test_block_keys_name_the_images_a_block_holds() -> None:
    mm = MultimodalPrompt(
        [_prompt_image(b"A" * 32, 20, 30), _prompt_image(b"B" * 32, 60, 4)],
        torch.zeros(3, 70, dtype=torch.int64),
    )
    assert mm.block_key(0, 16) == b""
    assert mm.block_key(16, 32).startswith(b"A" * 32)
    assert mm.block_key(48, 64) == (
        b"A" * 32 + (20).to_bytes(8, "little") + b"B" * 32 + (60).to_bytes(8, "little")
    )
    assert mm.block_key(64, 80) == b"" and mm.block_key(50, 60) == b""
    assert mm.block_key(40, 56) == mm.block_key(16, 32)
    tokens = list(range(16))
    # the same tokens with another image hash apart; without images as before
    assert chain_hash(None, tokens, b"A") != chain_hash(None, tokens, b"B")
    assert chain_hash(None, tokens) == chain_hash(None, tokens, b"")


def test_positions_past_the_prompt_add_delta_on_every_axis() -> None:
    positions = torch.tensor([[0, 1, 2, 2, 4], [0, 1, 2, 3, 4], [0, 1, 3, 2, 4]])
    mm = MultimodalPrompt([], positions, delta=-2)
    assert mm.positions_of(1, 3).tolist() == positions[:, 1:3].tolist()
    assert mm.positions_of(4, 7).tolist() == [[4, 3, 4]] * 3
    assert mm.positions_of(6, 8).tolist() == [[4, 5]] * 3


def test_chunks_end_outside_images_when_the_model_needs_whole_images() -> None:
    images = [_prompt_image(b"A" * 32, 20, 30), _prompt_image(b"B" * 32, 60, 4)]
    whole = MultimodalPrompt(images, torch.zeros(1, 70, dtype=torch.int64), whole_images=True)
    assert whole.chunk_end(0, 16) == 16  # before the first image
    assert whole.chunk_end(0, 20) == 20 and whole.chunk_end(0, 50) == 50  # up to an image's end
    assert whole.chunk_end(0, 30) == 20  # would cut image A: stop where it starts
    assert whole.chunk_end(16, 48) == 48  # 16..63 holds image B whole (60..63)
    assert whole.chunk_end(16, 46) == 44  # 16..61 would cut image B: stop at 60
    assert whole.chunk_end(20, 10) == 0  # image A cannot start in a chunk of 10
    assert whole.chunk_end(30, 10) == 0  # the rest of A (a prefix-cache hit inside it) neither
    assert whole.chunk_end(30, 20) == 20
    plain = MultimodalPrompt(images, torch.zeros(1, 70, dtype=torch.int64))
    assert plain.chunk_end(0, 30) == 30


def _png(mode: str = "RGB") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, (3, 2), 7).save(buf, format="PNG")
    return buf.getvalue()


def test_data_urls_and_image_digests() -> None:
    data = _png()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert decode_data_url(url) == data
    with pytest.raises(ValueError, match="where: expected a data: URL"):
        decode_data_url("https://example.com/x.png", "where")
    with pytest.raises(ValueError, match="must be base64"):
        decode_data_url("data:image/png,abc")
    with pytest.raises(ValueError, match="not valid base64"):
        decode_data_url("data:image/png;base64,@@@")
    # the digest is of the decoded pixels: PNG bytes and the image itself agree
    assert image_digest(load_image(data)) == image_digest(load_image(load_image(data)))
    assert image_digest(load_image(data)) != image_digest(load_image(_png("L")))
    with pytest.raises(ValueError, match="img: not a readable image"):
        load_image(b"nope", "img")
    with pytest.raises(ValueError, match="expected a PIL image, a path or image bytes"):
        load_image(3.5)


def test_chat_image_parts_become_template_parts_in_order() -> None:
    url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": b"first"},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        },
    ]
    out, images = chat_images(messages)
    assert out[0] == messages[0]
    assert out[1]["content"] == [
        {"type": "image"},
        {"type": "text", "text": "and"},
        {"type": "image"},
    ]
    assert images == [b"first", _png()]
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\].image: an image part"):
        chat_images([{"role": "user", "content": [{"type": "image"}]}])
