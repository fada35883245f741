"""The Gated DeltaNet kernels (chunked gated delta rule, its one-token step, the short causal
conv and its update) against their torch references, on random inputs from the test seed: sequence lengths
from 1 to 2,048 around the chunk boundaries, many sequences in one launch, the state carried
across calls in its slot, padding rows on the dummy slot, grouped key heads.

On a CUDA machine these run on the GPU at Qwen3-Next's head sizes (``pytest -m gpu
tests/kernels/test_gated_delta_kernels.py``); under ``TRITON_INTERPRET=1``
(``test_interpreter.py`` launches this module that way) at tiny head sizes.
"""

from __future__ import annotations

import os

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import (
    causal_conv1d,
    causal_conv1d_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    gated_delta_step,
    gated_delta_step_ref,
    gated_rms_norm,
    gated_rms_norm_ref,
    gdn_gating,
)

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
# Qwen3-Next's linear-attention heads on the GPU (per tensor-parallel rank of 1: 16 key heads,
# 32 value heads of 128); tiny ones in the interpreter, one of them not a power of two
HEADS = (2, 4, 16, 24) if INTERPRET else (16, 32, 128, 128)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def rng(seed_hint: int) -> torch.Generator:
    seed = base_seed() ^ seed_hint
    print(f"input seed {seed} (TALLOW_TEST_SEED={base_seed()} replays it)")
    return torch.Generator(device="cpu").manual_seed(seed)


def starts_of(lengths: list[int]) -> list[int]:
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return starts


def delta_inputs(gen: torch.Generator, tokens: int, dtype: torch.dtype):
    hk, hv, dk, dv = HEADS

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)

    a = torch.randn(tokens, hv, generator=gen)
    b = torch.randn(tokens, hv, generator=gen)
    A_log = torch.rand(hv, generator=gen).mul(8).add(0.01).log()
    dt_bias = torch.randn(hv, generator=gen) * 0.5
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    return (
        randn(tokens, hk, dk),
        randn(tokens, hk, dk),
        randn(tokens, hv, dv),
        g.to(DEVICE),
        beta.to(DEVICE),
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, rel: float) -> None:
    """Within ``rel`` of the expected values' scale (float32 sums in another order; on the GPU
    the chunk's products run on tensor cores in tf32)."""
    scale = float(expected.float().abs().max()) + 1e-6
    err = float((actual.float().cpu() - expected.float().cpu()).abs().max())
    assert err <= rel * scale, f"{what}: max |diff| {err:.3e} > {rel} * {scale:.3e}"


def tolerance(dtype: torch.dtype) -> float:
    if INTERPRET:
        # float32 on both sides, but the chunk form solves a unit lower-triangular system per
        # chunk whose rounding grows with the gates' conditioning: about one seed in a few
        # hundred reaches 1.1e-5 of the scale, so 5e-5 bounds it with margin
        return 5e-5
    return 3e-2 if dtype == torch.bfloat16 else 1e-4


CASES = {
    "one-sequence-lengths": [[1], [2], [63], [64], [65], [127], [128], [129], [2048]],
    "many-sequences": [[1, 5, 64, 0, 65, 3, 130, 17, 1, 1, 200, 64, 9]],
}


@pytest.mark.parametrize(
    "dtype", [torch.float32] if INTERPRET else [torch.float32, torch.bfloat16], ids=str
)
@pytest.mark.parametrize(
    "lengths",
    [x for v in CASES.values() for x in v],
    ids=lambda v: "+".join(map(str, v)) if len(v) < 4 else "many",
)
def test_chunk_rule_matches_the_reference(lengths, dtype):
    gen = rng(sum(lengths))
    hk, hv, dk, dv = HEADS
    q, k, v, g, beta = delta_inputs(gen, sum(lengths), dtype)
    num_slots = len(lengths) + 2
    state = (torch.randn(num_slots + 1, hv, dk, dv, generator=gen) * 0.1).to(DEVICE)
    expected_state = state.cpu().clone()
    slots = torch.randperm(num_slots, generator=gen)[: len(lengths)].to(DEVICE)
    starts = starts_of(lengths)
    qsl = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    out = chunk_gated_delta_rule(q, k, v, g, beta, state, slots, qsl, max_query_len=max(lengths))
    ref = chunk_gated_delta_rule_ref(
        q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), expected_state, slots.cpu(), starts
    )
    rel = tolerance(dtype)
    assert_close(out, ref, f"outputs {lengths}", rel)
    assert_close(state, expected_state, f"states {lengths}", rel)
    untouched = [s for s in range(num_slots + 1) if s not in slots.tolist()]
    assert torch.equal(state[untouched].cpu(), expected_state[untouched])


def test_chunk_rule_carries_the_state_across_calls():
    """A prompt prefilled in chunks of odd sizes (calls of a chunked prefill, beside other
    sequences) ends with the outputs and state of one call over the whole prompt."""
    gen = rng(7)
    hk, hv, dk, dv = HEADS
    total = 300
    q, k, v, g, beta = delta_inputs(gen, total, torch.float32)
    state = torch.zeros(4, hv, dk, dv, device=DEVICE)
    whole_state = state.clone()
    whole = chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        whole_state,
        torch.tensor([1], device=DEVICE),
        torch.tensor([0, total], dtype=torch.int32, device=DEVICE),
        max_query_len=total,
    )
    pieces = []
    at = 0
    for size in (1, 70, 64, 100, 65):
        other = delta_inputs(gen, 9, torch.float32)  # a second sequence in the same launch
        cat = [torch.cat([x[at : at + size], o]) for x, o in zip((q, k, v, g, beta), other)]
        out = chunk_gated_delta_rule(
            *cat,
            state,
            torch.tensor([1, 2], device=DEVICE),
            torch.tensor([0, size, size + 9], dtype=torch.int32, device=DEVICE),
            max_query_len=size,
        )
        pieces.append(out[:size])
        at += size
    assert at == total
    rel = 1e-5 if INTERPRET else 1e-4
    assert_close(torch.cat(pieces), whole, "outputs of the chunked prefill", rel)
    assert_close(state[1], whole_state[1], "state after the chunked prefill", rel)


@pytest.mark.parametrize("rows", [1, 7])
def test_step_matches_the_reference(rows):
    """One token per row; the last row is a CUDA graph's padding on the dummy slot."""
    gen = rng(rows)
    hk, hv, dk, dv = HEADS
    q, k, v, _, _ = delta_inputs(gen, rows, torch.float32)
    a = torch.randn(rows, hv, generator=gen).to(DEVICE)
    b = torch.randn(rows, hv, generator=gen).to(DEVICE)
    A_log = torch.rand(hv, generator=gen).add(0.01).log().to(DEVICE)
    dt_bias = torch.randn(hv, generator=gen).to(DEVICE)
    num_slots = rows + 3
    state = (torch.randn(num_slots + 1, hv, dk, dv, generator=gen) * 0.3).to(DEVICE)
    expected = state.clone()
    slots = torch.randperm(num_slots, generator=gen)[:rows]
    slots[-1] = num_slots  # the dummy
    slots = slots.to(DEVICE)
    out = gated_delta_step(q, k, v, a, b, A_log, dt_bias, state, slots)
    ref = gated_delta_step_ref(q, k, v, a, b, A_log, dt_bias, expected, slots)
    assert_close(out, ref, "step outputs", 1e-5 if INTERPRET else 1e-4)
    assert_close(state, expected, "states after the step", 1e-5 if INTERPRET else 1e-4)


CONV_CHANNELS = 40 if INTERPRET else 8192  # Qwen3-Next: 2 * 16 * 128 + 32 * 128


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(
    "lengths", [[1], [2, 3, 1], [31, 32, 33, 0, 100], [2048]], ids=lambda v: "+".join(map(str, v))
)
def test_conv_matches_the_reference_across_calls(lengths, bias):
    """Two calls: the second continues every sequence from the state the first left."""
    gen = rng(len(lengths))
    taps = 4
    weight = torch.randn(CONV_CHANNELS, taps, generator=gen).to(DEVICE)
    b = torch.randn(CONV_CHANNELS, generator=gen).to(DEVICE) if bias else None
    num_slots = len(lengths) + 1
    state = torch.randn(num_slots + 1, taps - 1, CONV_CHANNELS, generator=gen).to(DEVICE)
    expected = state.clone()
    slots = torch.randperm(num_slots, generator=gen)[: len(lengths)].to(DEVICE)
    for call in range(2):
        starts = starts_of(lengths)
        x = torch.randn(starts[-1], CONV_CHANNELS, generator=gen).to(DEVICE)
        qsl = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
        out = causal_conv1d(x, weight, b, state, slots, qsl, max_query_len=max(lengths))
        ref = causal_conv1d_ref(x, weight, b, expected, slots, starts)
        assert_close(out, ref, f"conv outputs of call {call}", 1e-5)
        assert torch.equal(state, expected), f"conv states after call {call}"
        lengths = lengths[::-1]


def test_conv_update_matches_the_reference():
    gen = rng(3)
    taps, rows = 4, 6
    weight = torch.randn(CONV_CHANNELS, taps, generator=gen).to(DEVICE)
    b = torch.randn(CONV_CHANNELS, generator=gen).to(DEVICE)
    state = torch.randn(rows + 3, taps - 1, CONV_CHANNELS, generator=gen).to(DEVICE)
    expected = state.clone()
    slots = torch.tensor([4, 0, 2, 7, 1, 8], device=DEVICE)  # 8: the dummy
    for _ in range(3):
        x = torch.randn(rows, CONV_CHANNELS, generator=gen).to(DEVICE)
        out = causal_conv1d_update(x, weight, b, state, slots)
        ref = causal_conv1d_update_ref(x, weight, b, expected, slots)
        assert_close(out, ref, "conv update outputs", 1e-5)
        assert torch.equal(state, expected)


@pytest.mark.parametrize(
    "dtype", [torch.float32] if INTERPRET else [torch.float32, torch.bfloat16], ids=str
)
@pytest.mark.parametrize("rows", [1, 13, 300])
def test_gated_rms_norm_matches_the_reference(rows, dtype):
    """Rows of value heads, ``z`` a strided view of a wider projection (as the model's is)."""
    gen = rng(rows)
    hv, dv = HEADS[1], HEADS[3]
    x = (torch.randn(rows, hv, dv, generator=gen) * 2).to(dtype).to(DEVICE)
    wide = torch.randn(rows, 3 * hv * dv, generator=gen).to(dtype).to(DEVICE)
    z = wide[:, hv * dv : 2 * hv * dv].view(rows, hv, dv)
    weight = (1 + 0.2 * torch.randn(dv, generator=gen)).to(dtype).to(DEVICE)
    out = gated_rms_norm(x, z, weight, 1e-6)
    ref = gated_rms_norm_ref(x, z, weight, 1e-6)
    # float32: another order of the sum of squares; bf16: one rounding step apart at most
    assert_close(out, ref, "gated RMSNorm", 1e-5 if dtype == torch.float32 else 1e-2)
