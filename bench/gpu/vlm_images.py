"""Images in, text out: N requests with one image each, all admitted at once, timed twice.

* ``cold``: N distinct images the engine has never seen (every image is encoded);
* ``warm``: the same images behind another text prefix, so the prefix cache shares nothing
  and every image's embeddings come from the encoder cache.

Reports per run: images/s (N over the time until the last request's first token), TTFT
(mean, p50, p90, max, from the moment all requests are queued) and the encoder cache's
counters. One untimed request with an image of its own runs first. Usage::

    python bench/gpu/vlm_images.py --model random:qwen2.5-vl-7b --num-requests 64 \\
        --image-size 1024 --output out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np


def _images(count: int, size: int, seed: int = 0) -> list[Any]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB")
        for _ in range(count)
    ]


def _run(
    engine: Any, prompts: list[list[int]], images: list[Any], output_len: int, tag: str
) -> dict[str, Any]:
    from tallow import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    before = engine.stats()
    start = time.perf_counter()
    ids = []
    for i, (prompt, image) in enumerate(zip(prompts, images)):
        rid = f"{tag}-{i}"
        engine.add_request(rid, prompt, params, images=[image])
        ids.append(rid)
    first: dict[str, float] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id not in first and out.outputs and out.outputs[0].token_ids:
                first[out.request_id] = time.perf_counter() - start
    total = time.perf_counter() - start
    ttft = sorted(first[r] for r in ids)
    after = engine.stats()
    return {
        "images_per_s": len(ids) / ttft[-1],
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p50_s": ttft[len(ttft) // 2],
        "ttft_p90_s": ttft[int(len(ttft) * 0.9) - 1],
        "ttft_max_s": ttft[-1],
        "total_s": total,
        "images_encoded": after.get("images_encoded", 0) - before.get("images_encoded", 0),
        "encoder_cache_hits": (
            after.get("encoder_cache_hits", 0) - before.get("encoder_cache_hits", 0)
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:qwen2.5-vl-7b")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()

    from tallow import LLM

    settings: dict[str, Any] = {"dtype": args.dtype, "max_model_len": args.max_model_len}
    if args.device:
        settings["device"] = args.device
    llm = LLM(model=args.model, **settings)
    engine = llm.engine
    model = engine.images.model if engine.images is not None else None
    if model is None:
        raise SystemExit(f"{args.model} takes no images")
    token = model.image_token_id
    cfg = model.config
    start, end = int(cfg["vision_start_token_id"]), int(cfg["vision_end_token_id"])
    images = _images(args.num_requests, args.image_size)
    # 16 text tokens before the image and 16 after; the warm run changes those before it
    cold = [
        [100 + j for j in range(16)] + [start, token, end] + [300 + j for j in range(16)]
        for _ in images
    ]
    warm = [
        [200 + j for j in range(16)] + [start, token, end] + [300 + j for j in range(16)]
        for _ in images
    ]
    tokens = model.process_image(images[0]).num_tokens
    # one request first, with an image of its own: kernels compile and caches fill outside
    # the timed runs
    extra = _images(1, args.image_size, seed=1)
    _run(engine, warm[:1], extra, args.output_len, "warmup")
    result = {
        "model": args.model,
        "num_requests": args.num_requests,
        "image_size": args.image_size,
        "image_tokens": tokens,
        "cold": _run(engine, cold, images, args.output_len, "cold"),
        "warm": _run(engine, warm, images, args.output_len, "warm"),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
