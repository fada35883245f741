"""The plain-torch attention (the CPU path of the engine) in bounded memory: a long context is
computed over query and key blocks with an online softmax, equal to the one-piece formula, and
its peak memory does not grow with the square of the context."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from tallow.kernels.attention_ref import attention_ref


def _inputs(
    n_q: int, n_ctx: int, heads: int, kv_heads: int, dim: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n_q, heads, dim, generator=gen)
    k = torch.randn(n_ctx, kv_heads, dim, generator=gen)
    v = torch.randn(n_ctx, kv_heads, dim, generator=gen)
    return q, k, v


CASES = [  # n_q, n_ctx, causal, window, softcap, sinks
    (37, 37, True, None, None, False),  # a whole prompt
    (9, 70, True, None, None, False),  # a prefill chunk after 61 cached tokens
    (1, 70, True, None, None, False),  # a decode step
    (40, 40, False, None, None, False),  # an encoder (bidirectional)
    (33, 90, True, 7, None, False),  # a sliding window smaller than a key block
    (33, 90, False, 11, None, False),
    (50, 50, True, None, 30.0, False),  # logit soft-capping
    (25, 60, True, 9, None, True),  # sinks (gpt-oss)
    (30, 75, True, None, None, False, 16),  # chunked local attention (Llama 4)
    (1, 75, True, None, None, False, 16),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("budget", [4 * 8 * 8, 4 * 3 * 5, 4])
def test_blocked_attention_equals_the_one_piece_formula(case, budget: int) -> None:
    n_q, n_ctx, causal, window, softcap, with_sinks, *chunk = case
    q, k, v = _inputs(n_q, n_ctx, heads=4, kv_heads=2, dim=8, seed=n_q * 100 + n_ctx)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(1)) if with_sinks else None
    kwargs = dict(
        scale=8**-0.5,
        context_len=n_ctx,
        sliding_window=window,
        logit_softcap=softcap,
        causal=causal,
        sinks=sinks,
        attention_chunk_size=chunk[0] if chunk else None,
    )
    whole = attention_ref(q, k, v, **kwargs, max_score_elements=1 << 40)
    blocked = attention_ref(q, k, v, **kwargs, max_score_elements=budget)
    assert 4 * n_q * n_ctx > budget  # the blocked path did run
    torch.testing.assert_close(blocked, whole, rtol=1e-5, atol=1e-6)


def test_blocked_attention_keeps_the_input_dtype() -> None:
    q, k, v = _inputs(20, 20, heads=2, kv_heads=1, dim=8, seed=3)
    out = attention_ref(
        q.to(torch.bfloat16),
        k.to(torch.bfloat16),
        v.to(torch.bfloat16),
        scale=0.3,
        context_len=20,
        max_score_elements=16,
    )
    ref = attention_ref(
        q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), scale=0.3, context_len=20
    )
    assert out.dtype is torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


_PEAK = textwrap.dedent("""
    import resource, torch
    from tallow.kernels.attention_ref import attention_ref
    torch.set_num_threads(2)
    n, heads, dim = 8192, 4, 16
    q = torch.randn(n, heads, dim); k = torch.randn(n, 2, dim); v = torch.randn(n, 2, dim)
    attention_ref(q[:8], k[:8], v[:8], scale=0.25, context_len=8)  # warm the allocator
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = attention_ref(q, k, v, scale=0.25, context_len=n)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert torch.isfinite(out).all()
    print((after - before) // 1024)
""")


def test_long_context_attention_peak_memory_is_bounded() -> None:
    """8,192 queries over 8,192 keys, 4 heads: the one-piece float32 score matrix alone is
    1 GiB (and its masked copy and softmax as much again); the blocked path's work space is a
    few hundred MiB at most."""
    out = subprocess.run([sys.executable, "-c", _PEAK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    grown_mib = int(out.stdout.strip().splitlines()[-1])
    assert grown_mib < 400, f"peak memory grew by {grown_mib} MiB"


def test_a_context_past_the_rotary_positions_is_refused_at_start_up() -> None:
    """random:tiny-llama covers 2,048 positions: a longer max_model_len used to be accepted
    and kill the engine at the first request past them; now start-up refuses it."""
    from tallow import LLM

    with pytest.raises(ValueError, match=r"max_model_len 4096 is longer than the 2048 positions"):
        LLM("random:tiny-llama", device="cpu", dtype="float32", max_model_len=4096)
    llm = LLM("random:tiny-llama", device="cpu", dtype="float32", max_model_len=2048)
    assert llm is not None


@pytest.mark.parametrize("n_q, n_ctx", [(75, 75), (11, 75), (1, 64), (1, 65)])
def test_chunked_attention_is_causal_attention_within_each_chunk(n_q: int, n_ctx: int) -> None:
    """With ``attention_chunk_size`` 16 each query attends exactly as plain causal attention
    over the keys of its own chunk alone (positions ``16c .. 16c+15``): computed here chunk
    by chunk, through the unmasked formula."""
    chunk = 16
    q, k, v = _inputs(n_q, n_ctx, heads=4, kv_heads=2, dim=8, seed=n_q + n_ctx)
    out = attention_ref(q, k, v, scale=0.4, context_len=n_ctx, attention_chunk_size=chunk)
    first = n_ctx - n_q
    for i in range(n_q):
        pos = first + i
        start = pos // chunk * chunk
        ref = attention_ref(
            q[i : i + 1],
            k[start : pos + 1],
            v[start : pos + 1],
            scale=0.4,
            context_len=pos + 1 - start,
        )
        torch.testing.assert_close(out[i : i + 1], ref, rtol=1e-5, atol=1e-6)
    if n_q == n_ctx:  # past the first chunk the result differs from full causal attention
        full = attention_ref(q, k, v, scale=0.4, context_len=n_ctx)
        torch.testing.assert_close(out[:chunk], full[:chunk])
        assert not torch.allclose(out[chunk:], full[chunk:], atol=1e-3)
