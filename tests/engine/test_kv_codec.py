"""KV codecs through the engine: the fp8 caches of tallow-kvcache-fp8 against transformers
with its keys and values rounded the same way, the KV budget in blocks, and the errors for a
codec that does not exist or that the attention backend cannot serve."""

from __future__ import annotations

import pytest
import torch

from tallow import LLM, SamplingParams
from tallow.kernels.attention_ref import to_cache_dtype
from tallow.plugin import SelectionError

PROMPT = "Paged attention stores keys and values in fixed-size blocks. Continuous batching"
STEPS = 12
CODECS = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def hf_model(path, cache_dtype: torch.dtype | None):
    """The transformers model of ``path``; with ``cache_dtype``, every attention sees its keys
    and values as a cache of that dtype holds them (tallow's own rounding function)."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cache_dtype is None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def rounded_kv_attention(module, query, key, value, attention_mask, **kwargs):
        key = to_cache_dtype(key, cache_dtype).to(key.dtype)
        value = to_cache_dtype(value, cache_dtype).to(value.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    name = f"sdpa-kv-{str(cache_dtype).removeprefix('torch.')}"
    AttentionInterface.register(name, rounded_kv_attention)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=name)


def hf_run(model, ids: list[int]) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """(prompt log-probs [len-1], greedy tokens, their log-prob rows [STEPS, vocab])."""
    with torch.no_grad():
        prompt = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        out = model.generate(torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0)
    steps = torch.stack([torch.log_softmax(s[0].float(), -1) for s in out.logits])
    picked = prompt[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    return picked, out.sequences[0, len(ids):].tolist(), steps


@pytest.mark.parametrize("codec", list(CODECS))
def test_fp8_cache_matches_transformers_with_rounded_kv(tiny_llama, codec):
    llm = LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=128,
              block_size=4, kv_codec=codec)
    assert {c.dtype for c in llm.engine.core.runner.kv_caches} == {CODECS[codec]}
    ids = llm.get_tokenizer().encode(PROMPT)
    out = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True,
                                             logprobs=0, prompt_logprobs=0))[0]
    got_prompt = torch.tensor([out.prompt_logprobs[p][ids[p]].logprob
                               for p in range(1, len(ids))])
    completion = out.outputs[0]

    ref_prompt, ref_tokens, ref_steps = hf_run(hf_model(tiny_llama, CODECS[codec]), ids)
    torch.testing.assert_close(got_prompt, ref_prompt, atol=1e-4, rtol=0)
    assert completion.token_ids == ref_tokens
    got_steps = torch.tensor([completion.logprobs[i][t].logprob
                              for i, t in enumerate(ref_tokens)])
    torch.testing.assert_close(got_steps, ref_steps[torch.arange(STEPS), ref_tokens],
                               atol=1e-4, rtol=0)
    # The rounding is visible: the unrounded model is further away than the tolerance.
    plain_prompt, _, _ = hf_run(hf_model(tiny_llama, None), ids)
    assert float((plain_prompt - got_prompt).abs().max()) > 1e-3


def test_fp8_holds_four_times_the_blocks_of_a_float32_cache(tiny_llama):
    blocks = {}
    for codec in ("auto", "fp8"):
        llm = LLM(model=str(tiny_llama), dtype="float32", device="cpu", mem_mb=1,
                  block_size=4, max_model_len=256, kv_codec=codec)
        blocks[codec] = llm.engine.core.runner.kv_caches[0].shape[1]
        assert llm.engine.core.scheduler.block_manager.num_free_blocks == blocks[codec]
    assert blocks["fp8"] == 4 * blocks["auto"] > 0


def test_unknown_codec_names_the_field_and_the_choices(tiny_llama):
    with pytest.raises(SelectionError) as info:
        LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=64, kv_codec="fp4")
    text = str(info.value)
    assert text.startswith("cache.kv_codec 'fp4': ")
    assert "fp8" in text and "auto" in text and "plugins" in text


def test_codec_with_its_own_encoding_is_refused_by_the_torch_backend(tiny_llama, monkeypatch):
    from tallow_kvcache_fp8.codec import FP8E4M3KVCodec

    monkeypatch.setattr(FP8E4M3KVCodec, "elementwise", False)
    with pytest.raises(SelectionError, match=r"(?s)attention backend 'torch' cannot use kv codec "
                                             r"'fp8' \(cache.kv_codec.*own encoding"):
        LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=64, kv_codec="fp8")
