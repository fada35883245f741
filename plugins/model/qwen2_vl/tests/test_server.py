"""The official ``openai`` client against tallow's server serving the tiny Qwen2.5-VL: a chat
message with a data: URL image is answered with transformers' greedy tokens for the same image;
the same image twice moves the prefix- and encoder-cache counters of ``/metrics``; bad images
and images for a text-only model are 400s naming the parameter."""

from __future__ import annotations

import base64
import io
from typing import Any, Iterator

import pytest
import torch

openai = pytest.importorskip("openai")


def _data_url(img: Any, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    mime = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def client(checkpoint: tuple[Any, Any]) -> Iterator[Any]:
    from starlette.testclient import TestClient

    from tallow.engine.async_engine import AsyncEngine
    from tallow.plugin.manager import load_plugins
    from tallow.plugin.testing import make_config
    from tallow.server.app import build_app

    config = make_config(
        {
            "model": {
                "source": str(checkpoint[1]),
                "device": "cpu",
                "dtype": "float32",
                "max_model_len": 256,
            },
            "cache": {"num_blocks": 64, "block_size": 16},
            "plugins": {
                "autoload": False,
                "enable": [
                    "tallow-model-qwen2-vl",
                    "tallow-model-llama",
                    "tallow-format-safetensors",
                ],
            },
        }
    )
    pm = load_plugins(config.plugins, env={})
    engine = AsyncEngine.from_config(config, pm)
    with TestClient(build_app(engine, config), raise_server_exceptions=False) as http:
        http.sdk = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
        )
        yield http


def _metrics(http: Any) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            out[sample.name] = sample.value
    return out


def _messages(url: str, detail: str | None = None) -> list[dict[str, Any]]:
    image_url = {"url": url} if detail is None else {"url": url, "detail": detail}
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "w5 w17 w40"},
                {"type": "image_url", "image_url": image_url},
                {"type": "text", "text": "w88 w120 w9 w64"},
            ],
        }
    ]


def _hf_greedy(kit: Any, hf: Any, img: Any, steps: int) -> list[int]:
    from transformers import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(
        **{k: v for k, v in kit.PREPROCESSOR.items() if k != "image_processor_type"}
    )
    out = proc(images=[img], return_tensors="pt")
    n = int(out["image_grid_thw"][0].prod()) // 4
    ids = torch.tensor(
        [[5, 17, 40, kit.VISION_START] + [kit.IMAGE_TOKEN] * n + [kit.VISION_END, 88, 120, 9, 64]]
    )
    with torch.no_grad():
        gen = hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=out["pixel_values"],
            image_grid_thw=out["image_grid_thw"],
            mm_token_type_ids=(ids == kit.IMAGE_TOKEN).int(),
            max_new_tokens=steps,
            do_sample=False,
        )
    return gen[0, ids.shape[1] :].tolist()


def test_chat_with_a_data_url_image(kit, checkpoint, client) -> None:
    img = kit.image(120, 90, seed=31)
    ref = _hf_greedy(kit, checkpoint[0], img, 8)
    before = _metrics(client)
    resp = client.sdk.chat.completions.create(
        model=client.sdk.models.list().data[0].id,
        messages=_messages(_data_url(img), "high"),
        max_tokens=8,
        temperature=0,
        logprobs=True,
    )
    (choice,) = resp.choices
    tokens = [int(lp.token[1:]) for lp in choice.logprobs.content]  # "w<id>"
    eos = 1
    expected = ref[: ref.index(eos) + 1] if eos in ref else ref
    assert tokens == expected[: len(tokens)] and len(tokens) == len(expected)
    assert resp.usage.prompt_tokens > 12  # the image's tokens count as prompt tokens
    after = _metrics(client)
    assert after["tallow_images_encoded_total"] == before.get("tallow_images_encoded_total", 0) + 1

    # the same image again (as JPEG bytes of the same pixels it would differ: PNG again)
    again = client.sdk.chat.completions.create(
        model=resp.model, messages=_messages(_data_url(img)), max_tokens=8, temperature=0
    )
    assert again.choices[0].message.content == choice.message.content
    final = _metrics(client)
    assert final["tallow_images_encoded_total"] == after["tallow_images_encoded_total"]
    assert final["tallow_prefix_cache_hit_rate"] > 0


def test_streamed_answer_equals_the_whole_one(kit, client) -> None:
    url = _data_url(kit.image(60, 100, "RGBA", seed=32), "WEBP")
    model = client.sdk.models.list().data[0].id
    whole = client.sdk.chat.completions.create(
        model=model, messages=_messages(url), max_tokens=6, temperature=0
    )
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.sdk.chat.completions.create(
            model=model, messages=_messages(url), max_tokens=6, temperature=0, stream=True
        )
        if c.choices
    )
    assert text == whole.choices[0].message.content


@pytest.mark.parametrize(
    "url,needle",
    [
        ("https://example.com/cat.png", "no host is allowed"),
        ("data:image/png;base64,!!!", "not valid base64"),
        (
            "data:image/png;base64," + base64.b64encode(b"plain text").decode(),
            "send PNG, JPEG or WebP",
        ),
    ],
)
def test_bad_images_are_400s_naming_the_part(client, url, needle) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.sdk.chat.completions.create(
            model=client.sdk.models.list().data[0].id, messages=_messages(url), max_tokens=2
        )
    body = err.value.body
    assert body["param"] == "messages[0].content[1].image_url.url"
    assert needle in body["message"]


def test_bad_detail_is_a_400(kit, client) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.sdk.chat.completions.create(
            model=client.sdk.models.list().data[0].id,
            messages=_messages(_data_url(kit.image(40, 40)), "huge"),
            max_tokens=2,
        )
    assert err.value.body["param"] == "messages[0].content[1].image_url.detail"
