"""The KV codecs' calibration pass on the tokens it is given: a tokenizer that knows no word
of the calibration text (a ``random:`` model's synthetic vocabulary reads each word as its
unknown token) must not leave the codec fitted to one token repeated."""

from __future__ import annotations

import torch

from tallow.engine.kv_calibration import MIN_DISTINCT_IDS, calibration_ids, record_qkv
from tallow.engine.llm_engine import LLMEngine


def random_engine(shape: str, codec: str) -> LLMEngine:
    from tallow.config import config_from_mapping

    return LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": f"random:{shape}",
                    "dtype": "float32",
                    "device": "cpu",
                    "max_model_len": 256,
                },
                "cache": {"num_blocks": 64, "kv_codec": codec, "enable_prefix_caching": False},
            }
        )
    )


class _UnknownWords:
    """A tokenizer whose every word is its unknown token 0."""

    def encode(self, text: str) -> list[int]:
        return [0] * len(text.split())


def test_a_tokenizer_that_knows_no_word_gets_ids_drawn_from_the_vocabulary():
    ids = calibration_ids(_UnknownWords(), vocab_size=500, max_tokens=300)
    assert len(ids) == 300 and all(0 <= i < 500 for i in ids)
    assert len(set(ids)) > 150
    assert ids == calibration_ids(_UnknownWords(), vocab_size=500, max_tokens=300)
    assert MIN_DISTINCT_IDS > 1


def test_turbo8_keys_of_a_random_model_score_as_the_exact_keys(monkeypatch):
    """turbo8 on one layer of ``random:llama-3.2-1b`` (its attention and rotary embedding; a
    small vocabulary and MLP): the scores of a random prompt's queries against its keys read
    back through the calibrated codec stay within 0.1 of the exact keys' scores (about 0.03).
    Calibrated on one token repeated, the smoothing fits the positions' rotation of that one
    key and sits at its clamp, and the error is near 2; the Triton backend's queries,
    rounded to 16 bits in the smoothed coordinates, then also part from the torch reference
    (by about 0.5)."""
    from tallow.engine import random_model

    monkeypatch.setitem(
        random_model.SHAPES,
        "llama-3.2-1b-attention",
        {
            **random_model.SHAPES["llama-3.2-1b"],
            "num_hidden_layers": 1,
            "intermediate_size": 256,
            "vocab_size": 4096,
        },
    )
    eng = random_engine("llama-3.2-1b-attention", "turbo8")
    runner = eng.core.runner
    ids = torch.randint(10, 4000, (128,), generator=torch.Generator().manual_seed(5)).tolist()
    seen = record_qkv(runner, ids)
    slots = torch.arange(len(ids))
    blocks = torch.arange(-(-len(ids) // runner.block_size))
    for attn, cache in zip(runner.layers, runner.kv_caches):
        q, k, v = seen[attn.layer.layer_index]
        cache.codec.encode(cache, k, v, slots)
        k_read = cache.codec.decode(cache, blocks)[0][: len(ids)]
        group = q.shape[1] // k.shape[1]
        exact = torch.einsum("nhd,mhd->hnm", q, k.repeat_interleave(group, 1))
        read = torch.einsum("nhd,mhd->hnm", q, k_read.repeat_interleave(group, 1))
        err = float(((read - exact) * attn.layer.scale).abs().max())
        assert err < 0.1, (attn.layer.layer_index, err, cache["k_smooth"].aminmax())


def test_the_per_layer_tensors_carry_all_of_a_turbo_codecs_calibration():
    """An engine calibrated on other weights, given another engine's weights and per-layer
    cache tensors (as the GPU tests share them), computes that engine's log-probs: nothing of
    the calibration lives outside the cache's per-layer tensors."""
    from tallow.engine.kv_calibration import calibrate_kv_codec
    from tallow import SamplingParams

    first, second = random_engine("tiny-llama", "turbo4"), random_engine("tiny-llama", "turbo4")
    model = second.parts.loaded.model
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.5)
    runner = second.core.runner
    calibrate_kv_codec(runner, runner.kv_caches[0].codec, _UnknownWords(), 512)
    before = {
        s.name: runner.kv_caches[0][s.name].clone()
        for s in runner.kv_caches[0].layout
        if not s.per_block
    }
    assert not torch.equal(before["k_smooth"], first.core.runner.kv_caches[0]["k_smooth"])
    model.load_state_dict(first.parts.loaded.model.state_dict())
    for mine, theirs in zip(first.core.runner.kv_caches, runner.kv_caches):
        for spec in mine.layout:
            if not spec.per_block:
                theirs[spec.name].copy_(mine[spec.name])
    prompt = torch.randint(10, 500, (40,), generator=torch.Generator().manual_seed(9)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)

    def logprobs(eng: LLMEngine) -> list[float]:
        eng.add_request(eng.next_request_id(), prompt, params)
        outs = [o for _ in range(8) for o in eng.step() if o.finished]
        return [outs[0].prompt_logprobs[i][t].logprob for i, t in enumerate(prompt) if i]

    assert logprobs(second) == logprobs(first)
