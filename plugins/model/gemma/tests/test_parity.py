"""Parity with transformers on tiny random Gemma 2 and Gemma 3 models (CPU, float32).

Each model is saved by transformers as safetensors, read back through tallow-format-safetensors into
the tallow class and run through a paged KV cache: the prompt's logits, 20 greedy tokens and
the logits of every step must match transformers' forward and greedy ``generate``. The prompt
is longer than the sliding window, and a run without the window must differ, so the window is
shown to matter; so are the softcaps, the attention scale and Gemma 3's two RoPE bases.
"""

from __future__ import annotations

import zlib

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
WINDOW = 6
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]


def gemma2_config(**kw):
    return transformers.Gemma2Config(
        **{
            **SMALL,
            "head_dim": 16,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 20,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 1.5,
            **kw,
        }
    )


def gemma3_config(**kw):
    return transformers.Gemma3TextConfig(
        **{
            **SMALL,
            "head_dim": 32,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 24,
            "layer_types": LAYER_TYPES,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            },
            **kw,
        }
    )


CONFIGS = {
    "gemma2": gemma2_config,
    "gemma2-gqa1-no-softcap": lambda: gemma2_config(
        num_key_value_heads=1, attn_logit_softcapping=None, final_logit_softcapping=None
    ),
    "gemma3": gemma3_config,
    "gemma3-final-softcap": lambda: gemma3_config(
        final_logit_softcapping=2.0, num_key_value_heads=4
    ),
}


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) % 1000


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_parity(name, tmp_path, kit):
    hf = kit.build_hf(CONFIGS[name](), seed=_seed(name), path=tmp_path)
    model, ckpt = kit.load_tallow(tmp_path)
    assert ckpt.architecture == type(hf).__name__

    ref_tokens, ref_logits, ref_prompt = kit.hf_generate(hf, kit.PROMPT)
    tokens, logits, prompt_logits = kit.PagedRunner(model).greedy(0, kit.PROMPT, kit.STEPS)

    kit.assert_close_logits(prompt_logits, ref_prompt, f"{name}: prompt logits")
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        kit.assert_close_logits(ours, ref, f"{name}: logits of step {i}")
    assert tokens == ref_tokens, f"{name}: greedy tokens differ"
    # a broken model predicts the same token everywhere
    assert len(set(tokens)) > 2, f"{name}: greedy output is nearly constant: {tokens}"
    assert len(set(prompt_logits.argmax(-1).tolist())) > 2


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("gemma2", {"sliding_window": None}),
        ("gemma3", {"sliding_window": None}),
        ("gemma2", {"attn_logit_softcapping": None}),
        ("gemma2", {"final_logit_softcapping": None}),
        ("gemma2", {"query_pre_attn_scalar": 16}),
        ("gemma3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    ],
)
def test_each_feature_matters(name, change, tmp_path, kit):
    """The same weights with one Gemma feature switched off no longer match transformers: the
    parity above therefore shows each feature is implemented, not merely harmless."""
    hf = kit.build_hf(CONFIGS[name](), seed=_seed(name), path=tmp_path)
    model, _ = kit.load_tallow(tmp_path, **change)
    ref = kit.hf_generate(hf, kit.PROMPT, steps=0)[2]
    ours = kit.PagedRunner(model).greedy(0, kit.PROMPT, 0)[2]
    err = float((ours - ref).abs().max())
    assert err > 1e-2, f"{name} with {change}: logits still match transformers ({err:.1e})"


def test_window_reaches_only_late_positions(tmp_path, kit):
    """Without the window only positions at or past it can change: earlier ones match."""
    hf = kit.build_hf(CONFIGS["gemma2"](), seed=_seed("gemma2"), path=tmp_path)
    model, _ = kit.load_tallow(tmp_path, sliding_window=None)
    ref = kit.hf_generate(hf, kit.PROMPT, steps=0)[2]
    ours = kit.PagedRunner(model).greedy(0, kit.PROMPT, 0)[2]
    kit.assert_close_logits(ours[:WINDOW], ref[:WINDOW], "positions inside the window")
    assert float((ours[WINDOW:] - ref[WINDOW:]).abs().max()) > 1e-2


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_chunked_prefill_and_two_sequences(name, tmp_path, kit):
    """Two sequences share each step: one prefilled in chunks that straddle the window while
    the other prefills whole and decodes; then both decode together."""
    hf = kit.build_hf(CONFIGS[name](), seed=_seed(name) + 1, path=tmp_path)
    model, _ = kit.load_tallow(tmp_path)
    kit.check_two_sequences(hf, model, name)


def test_bfloat16_build_tracks_float32(tmp_path, kit):
    """bfloat16 weights and activations (the embedding scale rounded as transformers rounds
    it) stay as near the float32 logits as transformers' bfloat16 does."""
    hf = kit.build_hf(CONFIGS["gemma3"](), seed=3, path=tmp_path)
    m16, _ = kit.load_tallow(tmp_path, dtype=torch.bfloat16)
    assert m16.model.normalizer.dtype == torch.bfloat16
    assert float(m16.model.normalizer) == 8.0  # sqrt(64), exact in bfloat16
    l16 = kit.PagedRunner(m16).greedy(0, kit.PROMPT, 0)[2]
    ref = kit.hf_generate(hf, kit.PROMPT, steps=0)[2]
    err = float((l16 - ref).abs().max())
    bound = 2 * kit.bf16_error_of_transformers(hf, kit.PROMPT) + 1e-2
    assert err <= bound, f"bfloat16 logits {err:.3f} from float32 (transformers' own: <{bound:.3f})"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_greedy_parity_on_cuda(name, tmp_path, kit):
    """Built and run on the GPU (Triton norms, rotary and GeGLU; torch reference attention)
    against transformers on the CPU: float32 logits close and the same greedy tokens; bfloat16
    as near them as transformers' own bfloat16."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hf = kit.build_hf(CONFIGS[name](), seed=_seed(name), path=tmp_path)
    model, _ = kit.load_tallow(tmp_path, device="cuda")
    assert all(t.is_cuda for t in [*model.parameters(), *model.buffers()])
    ref_tokens, ref_logits, ref_prompt = kit.hf_generate(hf, kit.PROMPT)
    tokens, logits, prompt_logits = kit.PagedRunner(model).greedy(0, kit.PROMPT, kit.STEPS)
    kit.assert_close_logits(prompt_logits.cpu(), ref_prompt, f"{name}: prompt logits", rel=1e-3)
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        kit.assert_close_logits(ours.cpu(), ref, f"{name}: logits of step {i}", rel=1e-3)
    assert tokens == ref_tokens
    m16, _ = kit.load_tallow(tmp_path, dtype=torch.bfloat16, device="cuda")
    l16 = kit.PagedRunner(m16).greedy(0, kit.PROMPT, 0)[2].cpu()
    err = float((l16 - ref_prompt).abs().max())
    bound = 2 * kit.bf16_error_of_transformers(hf, kit.PROMPT) + 1e-2
    assert err <= bound, f"{name}: bfloat16 logits {err:.3f} from float32 (bound {bound:.3f})"
