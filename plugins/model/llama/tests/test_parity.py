"""Parity with transformers on tiny random models of every architecture and RoPE variant.

Each model is saved by transformers as safetensors, read back through the tallow-format-safetensors
format into the tallow class, and run through a paged KV cache: the prompt's logits, 20 greedy
tokens and the logits of every step must match transformers' own forward and greedy
``generate`` on the same weights.
"""

from __future__ import annotations

import zlib

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.plugin.testing.model import hf_greedy  # noqa: E402

STEPS = 20
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def _llama(**kw):
    return transformers.LlamaConfig(**{**SMALL, "max_position_embeddings": 256, **kw})


CONFIGS = {
    "llama3": lambda: _llama(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        rope_theta=500000.0,
    ),
    "llama-linear-bias": lambda: _llama(
        rope_scaling={"rope_type": "linear", "factor": 2.0}, attention_bias=True, mlp_bias=True
    ),
    # max_position_embeddings below the sequence: the NTK base grows step by step
    "llama-dynamic": lambda: _llama(
        rope_scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=16
    ),
    "llama-yarn": lambda: _llama(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        max_position_embeddings=128,
    ),
    "llama-tied": lambda: _llama(tie_word_embeddings=True, num_key_value_heads=1),
    "mistral-window": lambda: transformers.MistralConfig(
        **SMALL, sliding_window=8, max_position_embeddings=256
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        **SMALL, max_position_embeddings=256, rope_theta=1000000.0
    ),
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, head_dim=32, max_position_embeddings=256),
}
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42]


def _hf_generate(model, prompt: list[int]):
    return hf_greedy(model, prompt, STEPS)


# plain Llama, Mistral, Qwen2 and Qwen3 configs: test_conformance.py
@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in ("qwen2", "qwen3")])
def test_greedy_parity(name, tmp_path, kit):
    config = CONFIGS[name]()
    hf = kit.build_hf(config, tmp_path, seed=zlib.crc32(name.encode()) % 1000)
    model, ckpt = kit.load_tallow(tmp_path)
    assert ckpt.architecture == type(hf).__name__

    ref_tokens, ref_logits, ref_prompt = _hf_generate(hf, PROMPT)
    runner = kit.PagedRunner(model)
    tokens, logits, prompt_logits = runner.greedy(0, PROMPT, STEPS)

    kit.assert_close_logits(prompt_logits, ref_prompt, f"{name}: prompt logits")
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        kit.assert_close_logits(ours, ref, f"{name}: logits of step {i}")
    assert tokens == ref_tokens, f"{name}: greedy tokens differ"
    # The logits must depend on the input: a broken model predicts the same token everywhere.
    assert len(set(prompt_logits.argmax(-1).tolist())) > 1


@pytest.mark.parametrize("name", ["llama3", "mistral-window", "qwen3"])
def test_flat_batch_of_two_sequences(name, tmp_path, kit):
    """Two sequences of different lengths share every step: one prefilled in two chunks while the
    other prefills whole and then decodes; afterwards both decode together."""
    config = CONFIGS[name]()
    hf = kit.build_hf(config, tmp_path, seed=7)
    model, _ = kit.load_tallow(tmp_path)
    a = [5, 9, 200, 13, 77, 101, 3]
    b = PROMPT + [8]
    ref_a, _, _ = _hf_generate(hf, a)
    ref_b, _, _ = _hf_generate(hf, b)
    steps = 8
    full_a, full_b = a + ref_a[:steps], b + ref_b[:steps]
    with torch.no_grad():
        ref_logits_a = hf(torch.tensor([full_a])).logits[0]
        ref_logits_b = hf(torch.tensor([full_b])).logits[0]

    runner = kit.PagedRunner(model)
    runner.add(0)
    runner.add(1)
    got_a: list[torch.Tensor] = []
    got_b: list[torch.Tensor] = []
    out_a, out_b = runner.step([(0, a[:4]), (1, b)])
    got_a.append(out_a)
    got_b.append(out_b)
    out_a, out_b = runner.step([(0, a[4:]), (1, [ref_b[0]])])
    got_a.append(out_a)
    got_b.append(out_b)
    for i in range(steps - 1):
        out_a, out_b = runner.step([(0, [ref_a[i]]), (1, [ref_b[i + 1]])])
        got_a.append(out_a)
        got_b.append(out_b)
    ours_a = torch.cat(got_a)
    ours_b = torch.cat(got_b)
    assert ours_a.shape[0] == len(a) + steps - 1
    assert ours_b.shape[0] == len(b) + steps
    kit.assert_close_logits(ours_a, ref_logits_a[: ours_a.shape[0]], f"{name}: sequence a")
    kit.assert_close_logits(ours_b, ref_logits_b[: ours_b.shape[0]], f"{name}: sequence b")
    assert [int(t) for t in ours_a[len(a) - 1 :].argmax(-1)] == ref_a[:steps]


def test_tied_head_shares_the_embedding(tmp_path, kit):
    hf = kit.build_hf(CONFIGS["llama-tied"](), tmp_path)
    model, _ = kit.load_tallow(tmp_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" not in dict(model.named_parameters())
    torch.testing.assert_close(model.lm_head.weight, hf.lm_head.weight, rtol=0, atol=0)


def test_bfloat16_build_tracks_float32(tmp_path, kit):
    """A bfloat16 build converts weights in the loaders and stays near the float32 logits."""
    kit.build_hf(CONFIGS["qwen2"](), tmp_path)
    m32, _ = kit.load_tallow(tmp_path)
    m16, _ = kit.load_tallow(tmp_path, dtype=torch.bfloat16)
    assert m16.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    l32 = kit.PagedRunner(m32).greedy(0, PROMPT, 0)[2]
    l16 = kit.PagedRunner(m16).greedy(0, PROMPT, 0)[2]
    assert l16.dtype == torch.float32  # compute_logits always hands back float32
    kit.assert_close_logits(l16, l32, "bfloat16 vs float32", rel=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama3", "llama-dynamic", "mistral-window", "qwen3"])
def test_greedy_parity_on_cuda(name, tmp_path, kit):
    """Built and run on the GPU (every buffer on the device), against transformers on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = kit.build_hf(CONFIGS[name](), tmp_path, seed=zlib.crc32(name.encode()) % 1000)
    model, _ = kit.load_tallow(tmp_path, device="cuda")
    assert all(t.is_cuda for t in [*model.parameters(), *model.buffers()])
    ref_tokens, ref_logits, ref_prompt = _hf_generate(hf, PROMPT)
    tokens, logits, prompt_logits = kit.PagedRunner(model).greedy(0, PROMPT, STEPS)
    kit.assert_close_logits(prompt_logits.cpu(), ref_prompt, f"{name}: prompt logits")
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        kit.assert_close_logits(ours.cpu(), ref, f"{name}: logits of step {i}")
    assert tokens == ref_tokens
    # bfloat16 on the GPU stays near the float32 reference
    m16, _ = kit.load_tallow(tmp_path, dtype=torch.bfloat16, device="cuda")
    l16 = kit.PagedRunner(m16).greedy(0, PROMPT, 0)[2]
    kit.assert_close_logits(l16.cpu(), ref_prompt, f"{name}: bfloat16 prompt logits", rel=5e-2)
