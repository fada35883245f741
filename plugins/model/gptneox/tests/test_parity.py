"""Parity with transformers through tallow's engine, beyond the conformance suite: a config
written with the hub's rotary keys, the scheduler's chunked prefills beside decodes, and the
GPU (float32 and bfloat16, both architectures)."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")


def test_config_with_the_hub_rotary_keys(tmp_path, neox):
    """Pythia's config.json says rotary_pct / rotary_emb_base, not rope_parameters (which
    newer transformers writes): rewritten so, it must decode the same."""
    hf = neox.save_tiny(tmp_path, seed=3, rotary_pct=0.25, rotary_emb_base=2000.0)
    file = tmp_path / "config.json"
    config = json.loads(file.read_text())
    rope = config.pop("rope_parameters")
    config.update(rotary_pct=rope["partial_rotary_factor"], rotary_emb_base=rope["rope_theta"])
    file.write_text(json.dumps(config))

    tokens, ref = neox.hf_reference(hf, neox.PROMPT)
    ours = neox.engine_greedy(neox.engine(tmp_path), neox.PROMPT)
    assert ours.tokens == tokens and len(set(tokens)) > 1
    neox.assert_logprobs_close(ours.prompt + ours.steps, ref, "hub-style config")


@pytest.mark.parametrize("model_type", ["gpt_neox", "stablelm"])
def test_chunked_prefills_beside_decodes_match_one_by_one(model_type, tmp_path, neox):
    """Three prompts of different lengths share steps; the scheduler cuts prefills into
    chunks of 5 tokens and fills 4-token KV blocks."""
    from tallow import SamplingParams

    hf = neox.save_tiny(tmp_path, seed=11, model_type=model_type)
    prompts = [neox.PROMPT, [7, 8, 9], list(range(40, 63))]
    refs = [neox.hf_reference(hf, p, steps=8)[0] for p in prompts]
    llm = neox.engine(
        tmp_path,
        scheduler={"prefill_chunk_size": 5, "max_num_batched_tokens": 16},
        cache={"block_size": 4},
    )
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [list(o.outputs[0].token_ids) for o in outs] == refs


# Pythia-shaped heads (64 features, a quarter rotated); StableLM with its optional parts on
GPU_SHAPES = {
    "gpt_neox": dict(
        hidden_size=256, intermediate_size=1024, num_attention_heads=4, rotary_pct=0.25
    ),
    "stablelm": dict(
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        partial_rotary_factor=0.25,
        qk_layernorm=True,
        use_parallel_residual=True,
        use_qkv_bias=True,
    ),
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
    tokens, ref = neox.hf_reference(hf, neox.PROMPT)
    llm = neox.engine(
        path,
        model={"device": device, "dtype": dtype, "max_model_len": 128},
        cache={"num_blocks": 64},
    )
    ours = neox.engine_greedy(llm, neox.PROMPT)
    assert len(set(ours.tokens)) > 1, "greedy output is constant"
    if dtype == "float32":
        assert ours.tokens == tokens
        neox.assert_logprobs_close(ours.prompt + ours.steps, ref, "float32", atol=2e-3)
        return
    forced = neox.engine_greedy(llm, neox.PROMPT + tokens, steps=1)
    clear = 0
    for i, (position, row) in enumerate(zip(forced.prompt, ref)):
        ids = torch.tensor(list(position))
        err = float((torch.tensor(list(position.values())) - row[ids]).abs().max())
        assert err <= 0.25, f"{dtype}, position {i}: max |logprob diff| {err:.3f}"
        top2 = row.topk(2).values
        if float(top2[0] - top2[1]) > 0.5:
            clear += 1
            best = max(position, key=position.get)
            assert best == int(row.argmax()), f"{dtype}, position {i}: top token differs"
    assert clear >= 5, "too few positions with a clear top token to compare"
