"""LongRoPE (tallow.layers.rope_scaling): frequencies and attention factor against transformers'
own rope functions, the choice of factor set per sequence of a flat batch, and errors."""

from __future__ import annotations

import math

import pytest
import torch

from tallow.layers import (
    AttentionMetadata,
    LongRoPERotaryEmbedding,
    apply_rotary,
    compute_inv_freq,
    context_lengths,
    forward_context,
    get_rope,
    longrope_attention_factor,
)

SHORT = [1.0 + 0.1 * i for i in range(8)]
LONG = [2.0 + 0.7 * i for i in range(8)]


def scaling(**extra) -> dict:
    return {
        "rope_type": "longrope",
        "short_factor": SHORT,
        "long_factor": LONG,
        "original_max_position_embeddings": 32,
        **extra,
    }


@pytest.mark.parametrize("extra", [{}, {"factor": 3.0}, {"attention_factor": 0.8}])
def test_frequencies_and_attention_factor_match_transformers(extra):
    transformers = pytest.importorskip("transformers", reason="transformers is the oracle")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.Phi3Config(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=256,
        original_max_position_embeddings=32,
        rope_scaling=scaling(**extra),
        rope_theta=5000.0,
    )
    longrope = ROPE_INIT_FUNCTIONS["longrope"]
    short, factor = longrope(config, None)
    long, _ = longrope(config, None, seq_len=33)
    rotary = get_rope(16, 16, 256, 5000.0, scaling(**extra))
    assert isinstance(rotary, LongRoPERotaryEmbedding)
    torch.testing.assert_close(rotary.inv_freq, short)
    torch.testing.assert_close(rotary.long_inv_freq, long)
    assert rotary.attention_scaling == pytest.approx(factor)
    inv, reported = compute_inv_freq(16, 256, 5000.0, scaling(**extra))
    torch.testing.assert_close(inv, short)
    assert reported == pytest.approx(factor)


def test_default_attention_factor():
    assert longrope_attention_factor({}, 4096, 4096) == 1.0
    assert longrope_attention_factor({}, 131072, 4096) == pytest.approx(
        math.sqrt(1 + math.log(32) / math.log(4096))
    )


def test_su_is_longrope():
    rotary = get_rope(16, 16, 256, 10000.0, {**scaling(), "rope_type": None, "type": "su"})
    assert isinstance(rotary, LongRoPERotaryEmbedding)


def _meta(starts: list[int], seq_lens: list[int]) -> AttentionMetadata:
    return AttentionMetadata(
        num_seqs=len(seq_lens),
        num_tokens=starts[-1],
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.zeros(len(seq_lens), 1, dtype=torch.int32),
        slot_mapping=torch.zeros(starts[-1], dtype=torch.int64),
        max_query_len=max(b - a for a, b in zip(starts, starts[1:])),
        max_seq_len=max(seq_lens),
        block_size=16,
    )


def test_each_sequence_of_a_step_picks_its_factor_set():
    """Three sequences in one step: a decode at 40 tokens (long), a prefill chunk ending at 32
    (short: not longer than the original) and a decode at 33 (long)."""
    rotary = get_rope(16, 16, 256, 10000.0, scaling())
    positions = torch.tensor([39, 28, 29, 30, 31, 32])
    with forward_context(_meta([0, 1, 5, 6], [40, 32, 33]), backend=None):
        assert context_lengths(positions).tolist() == [40, 32, 32, 32, 32, 33]
        rows = rotary.cache_rows(positions)
        assert rows.tolist() == [39 + 32, 28, 29, 30, 31, 32 + 32]
        q = torch.randn(6, 4 * 16)
        k = torch.randn(6, 2 * 16)
        q_out, k_out = rotary(positions, q.clone(), k.clone())
    # the reference: each token rotated with its own set's frequencies
    inv = torch.stack([rotary.long_inv_freq, *[rotary.inv_freq] * 4, rotary.long_inv_freq])
    angles = positions[:, None].float() * inv
    cos, sin = angles.cos() * rotary.attention_scaling, angles.sin() * rotary.attention_scaling
    torch.testing.assert_close(q_out, apply_rotary(q, cos, sin, 16, 16, True))
    torch.testing.assert_close(k_out, apply_rotary(k, cos, sin, 16, 16, True))


def test_outside_a_step_the_tokens_are_one_sequence():
    rotary = get_rope(16, 16, 256, 10000.0, scaling())
    assert rotary.cache_rows(torch.arange(32)).tolist() == list(range(32))
    assert rotary.cache_rows(torch.arange(33)).tolist() == list(range(32, 65))


def test_factors_set_later_rebuild_the_cache():
    """A GGUF file brings the factors as tensors after the model is built."""
    rotary = get_rope(
        16, 12, 256, 10000.0, {**scaling(), "short_factor": None, "long_factor": None}
    )
    assert rotary.cos_sin_cache.shape == (32 + 256, 12)
    assert torch.all(rotary.inv_freq == rotary.long_inv_freq)
    rotary.set_factors(torch.tensor(SHORT[:6]), torch.tensor(LONG[:6]))
    reference = get_rope(
        16, 12, 256, 10000.0, {**scaling(), "short_factor": SHORT[:6], "long_factor": LONG[:6]}
    )
    torch.testing.assert_close(rotary.cos_sin_cache, reference.cos_sin_cache)


def test_bad_configurations_are_named():
    with pytest.raises(ValueError, match="needs 'original_max_position_embeddings'"):
        get_rope(
            16,
            16,
            256,
            10000.0,
            {k: v for k, v in scaling().items() if k != "original_max_position_embeddings"},
        )
    with pytest.raises(ValueError, match=r"long_factor: 3 values, expected 8"):
        get_rope(16, 16, 256, 10000.0, scaling(long_factor=[1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="short_factor: every factor must be a positive"):
        get_rope(16, 16, 256, 10000.0, scaling(short_factor=[0.0] * 8))
    with pytest.raises(ValueError, match="set_factors"):
        get_rope(16, 16, 256, 10000.0, scaling()).set_freq_factors(torch.ones(8))


@pytest.mark.parametrize("neox", [True, False])
def test_the_kernel_entry_point_reads_the_two_table_cache(neox):
    """What the module hands the fused rotary kernel on a GPU (shifted rows into the one
    ``cos|sin`` cache) rotates as the module's own reference path does; partial rotary, both
    pair layouts. (With ``TRITON_INTERPRET=1`` the entry point runs the Triton kernel.)"""
    from tallow.kernels import rotary_embedding

    rotary = get_rope(
        16,
        12,
        256,
        10000.0,
        scaling(short_factor=SHORT[:6], long_factor=LONG[:6]),
        is_neox_style=neox,
    )
    positions = torch.tensor([39, 28, 29, 30, 31, 32])
    q, k = torch.randn(6, 4 * 16), torch.randn(6, 2 * 16)
    with forward_context(_meta([0, 1, 5, 6], [40, 32, 33]), backend=None):
        ref_q, ref_k = rotary(positions, q.clone(), k.clone())
        rows = rotary.cache_rows(positions)
    out_q, out_k = rotary_embedding(
        rows, q.clone(), k.clone(), rotary.cos_sin_cache, 16, is_neox=neox
    )
    torch.testing.assert_close(out_q, ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_k, ref_k, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_triton_rotary_reads_the_two_table_cache():
    """On CUDA the fused Triton rotary kernel rotates from the shifted rows (partial rotary,
    short and long sequences in one step) exactly as the CPU reference does."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cpu = get_rope(16, 12, 256, 10000.0, scaling(short_factor=SHORT[:6], long_factor=LONG[:6]))
    gpu = get_rope(
        16, 12, 256, 10000.0, scaling(short_factor=SHORT[:6], long_factor=LONG[:6]), device="cuda"
    )
    positions = torch.tensor([39, 28, 29, 30, 31, 32])
    q, k = torch.randn(6, 4 * 16), torch.randn(6, 2 * 16)
    meta = _meta([0, 1, 5, 6], [40, 32, 33])
    with forward_context(meta, backend=None):
        ref_q, ref_k = cpu(positions, q.clone(), k.clone())
    gpu_meta = _meta([0, 1, 5, 6], [40, 32, 33])
    for name in ("query_start_loc", "seq_lens", "block_tables", "slot_mapping"):
        setattr(gpu_meta, name, getattr(gpu_meta, name).cuda())
    with forward_context(gpu_meta, backend=None):
        out_q, out_k = gpu(positions.cuda(), q.cuda(), k.cuda())
    torch.testing.assert_close(out_q.cpu(), ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_k.cpu(), ref_k, rtol=1e-5, atol=1e-5)
