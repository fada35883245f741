"""Parity with transformers on tiny random GPT-NeoX models, through tallow's engine.

Each model is saved by transformers, loaded by ``tallow.LLM`` (the safetensors format, this
plugin's architecture, the engine's paged KV cache) and decoded greedily for 20 steps: the
tokens must be transformers' greedy tokens, and the log-probabilities of every prompt position
and every step must match transformers' on the same weights.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow import LLM, SamplingParams  # noqa: E402

CONFIGS = {
    "pythia": {},  # parallel residual, gelu, half of each head rotated
    "sequential-residual": dict(use_parallel_residual=False, rotary_pct=0.25,
                                rotary_emb_base=500.0),
    "no-bias-tied-full-rotary": dict(attention_bias=False, tie_word_embeddings=True,
                                     rotary_pct=1.0, hidden_act="gelu_new"),
    "relu-three-layers": dict(hidden_act="relu", num_hidden_layers=3, layer_norm_eps=1e-3),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity(name, tmp_path, neox):
    hf = neox.save_tiny(tmp_path, seed=len(name), **CONFIGS[name])
    neox.assert_greedy_parity(tmp_path, hf, name)


def test_config_with_the_hub_rotary_keys(tmp_path, neox):
    """Pythia's config.json says rotary_pct / rotary_emb_base, not rope_parameters."""
    hf = neox.save_tiny(tmp_path, seed=3, rotary_pct=0.25, rotary_emb_base=2000.0)
    config = neox.as_hub_config(tmp_path)
    assert "rope_parameters" not in config and config["rotary_pct"] == 0.25
    neox.assert_greedy_parity(tmp_path, hf, "hub config")


def test_batched_and_chunked_prefill_match_one_by_one(tmp_path, neox):
    """Three prompts of different lengths share steps, with prefills cut into chunks of 5."""
    hf = neox.save_tiny(tmp_path, seed=11)
    prompts = [neox.PROMPT, [7, 8, 9], list(range(40, 63))]
    refs = [neox.hf_greedy(hf, p, steps=8)[0].tokens for p in prompts]
    llm = LLM(model=str(tmp_path), max_model_len=128, prefill_chunk_size=5,
              max_num_batched_tokens=16, block_size=4)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == refs


# Pythia-shaped heads (64 features, a quarter rotated); StableLM with its optional parts on
GPU_SHAPES = {
    "gpt_neox": dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                     rotary_pct=0.25),
    "stablelm": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                     num_key_value_heads=2, partial_rotary_factor=0.25, qk_layernorm=True,
                     use_parallel_residual=True, use_qkv_bias=True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", list(GPU_SHAPES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_parity_on_cuda(dtype, model_type, tmp_path, neox):
    """The engine's CUDA path (its Triton kernels where they serve the dtype, CUDA graphs;
    the Triton attention backend in bfloat16) against transformers in float32 on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    check_against_float32(neox, tmp_path, "cuda", dtype, model_type)


def check_against_float32(neox, path, device: str, dtype: str, model_type: str) -> None:
    """A model of ``GPU_SHAPES`` on ``device`` in ``dtype``: float32 to the CPU tolerance's
    order; bfloat16 within its rounding on the prompt and transformers' greedy continuation
    fed as one prompt, with the same top token wherever float32's choice is clear."""
    hf = neox.save_tiny(path, seed=5, std=0.15, model_type=model_type, **GPU_SHAPES[model_type])
    ref, ref_logprobs = neox.hf_greedy(hf, neox.PROMPT)
    llm = LLM(model=str(path), max_model_len=128, device=device, dtype=dtype, num_blocks=64)
    ours = neox.tallow_greedy(llm, neox.PROMPT)
    assert len(set(ours.tokens)) > 1, "greedy output is constant"
    prompt_len = len(neox.PROMPT)
    if dtype == "float32":
        assert ours.tokens == ref.tokens
        neox.assert_logprobs_close(ours.prompt, ref_logprobs[:prompt_len - 1], "prompt",
                                   atol=2e-3)
        neox.assert_logprobs_close(ours.steps, ref_logprobs[prompt_len - 1:-1], "steps",
                                   atol=2e-3)
        return
    forced = neox.tallow_greedy(llm, neox.PROMPT + ref.tokens, steps=1)
    clear = 0
    for i, (position, row) in enumerate(zip(forced.prompt, ref_logprobs[:-1])):
        tokens = torch.tensor(list(position))
        err = float((torch.tensor(list(position.values())) - row[tokens]).abs().max())
        assert err <= 0.25, f"{dtype}, position {i}: max |logprob diff| {err:.3f}"
        top2 = row.topk(2).values
        if float(top2[0] - top2[1]) > 0.5:
            clear += 1
            best = max(position, key=position.get)
            assert best == int(row.argmax()), f"{dtype}, position {i}: top token differs"
    assert clear >= 5, "too few positions with a clear top token to compare"
