"""The torch references of the Gated DeltaNet kernels (``tallow.kernels.gated_delta``,
``tallow.kernels.causal_conv``) against transformers' Qwen3-Next functions
(``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule``, the causal conv),
on random inputs: whole sequences, several sequences in one flat step, and a sequence split
across calls with its state carried in its slot."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tallow.kernels import (
    causal_conv1d,
    causal_conv1d_ref,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    gated_delta_step,
    gated_rms_norm,
    gdn_gating,
    recurrent_gated_delta_rule_ref,
)

hf = pytest.importorskip(
    "transformers.models.qwen3_next.modeling_qwen3_next", reason="transformers is the oracle"
)

HK, HV, DK, DV = 2, 4, 16, 8


def inputs(length: int, seed: int, hk: int = HK, hv: int = HV):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(length, hk, DK, generator=g)
    k = torch.randn(length, hk, DK, generator=g)
    v = torch.randn(length, hv, DV, generator=g)
    a = torch.randn(length, hv, generator=g)
    b = torch.randn(length, hv, generator=g)
    A_log = torch.rand(hv, generator=g).mul(3).add(0.01).log()
    dt_bias = torch.randn(hv, generator=g) * 0.5
    return q, k, v, a, b, A_log, dt_bias


def hf_rule(q, k, v, g, beta, s0, chunked: bool):
    """transformers' functions on one sequence (batch 1), state in and out."""
    fn = hf.torch_chunk_gated_delta_rule if chunked else hf.torch_recurrent_gated_delta_rule
    out, state = fn(
        q[None],
        k[None],
        v[None],
        g=g[None],
        beta=beta[None],
        initial_state=s0[None].clone(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return out[0], state[0]


@pytest.mark.parametrize("length", [1, 5, 63, 64, 65, 130])
def test_one_sequence_matches_transformers(length):
    q, k, v, a, b, A_log, dt_bias = inputs(length, seed=length)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    s0 = torch.randn(HV, DK, DV, generator=torch.Generator().manual_seed(9)) * 0.3
    ref_out, ref_state = hf_rule(q, k, v, g, beta, s0, chunked=True)
    rec_out, rec_state = hf_rule(q, k, v, g, beta, s0, chunked=False)
    torch.testing.assert_close(ref_out, rec_out, atol=1e-4, rtol=1e-4)  # the oracle agrees

    out, state = recurrent_gated_delta_rule_ref(q, k, v, g, beta, s0)
    torch.testing.assert_close(out, rec_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, rec_state, atol=1e-5, rtol=1e-5)

    slots = torch.tensor([2])
    states = torch.zeros(4, HV, DK, DV)
    states[2] = s0
    out = chunk_gated_delta_rule_ref(q, k, v, g, beta, states, slots, [0, length])
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(states[2], ref_state, atol=1e-4, rtol=1e-4)
    assert not states[[0, 1, 3]].any(), "a slot of no sequence was written"


def test_the_gating_is_qwen3_nexts():
    _, _, _, a, b, A_log, dt_bias = inputs(7, seed=3)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    torch.testing.assert_close(g, -A_log.exp() * F.softplus(a + dt_bias))
    torch.testing.assert_close(beta, b.sigmoid())
    assert (g < 0).all()


def test_flat_step_of_many_sequences_and_carried_state():
    """Five sequences in one step (one empty), each from its own slot, then each continued in
    a second step: outputs and final states are transformers' over the whole sequences."""
    lengths = [70, 1, 0, 128, 9]
    more = [3, 64, 5, 1, 60]
    slots = torch.tensor([4, 0, 2, 5, 1])
    states = torch.zeros(7, HV, DK, DV)
    whole = [inputs(n + m, seed=10 + i) for i, (n, m) in enumerate(zip(lengths, more))]
    expected_out, expected_state = [], []
    for x in whole:
        g, beta = gdn_gating(*x[3:])
        o, s = hf_rule(*x[:3], g, beta, torch.zeros(HV, DK, DV), chunked=True)
        expected_out.append(o)
        expected_state.append(s)
    for step, (lo, counts) in enumerate([([0] * 5, lengths), (lengths, more)]):
        parts = [
            [t[start : start + n] for t in x[:5]] + list(x[5:])
            for x, start, n in zip(whole, lo, counts)
        ]
        starts = [0]
        for n in counts:
            starts.append(starts[-1] + n)
        cat = [torch.cat([p[j] for p in parts]) for j in range(5)]
        g, beta = gdn_gating(cat[3], cat[4], whole[0][5], whole[0][6])
        # every sequence shares one layer's A_log and dt_bias: use the first's for all
        out = chunk_gated_delta_rule(
            cat[0],
            cat[1],
            cat[2],
            g,
            beta,
            states,
            slots,
            torch.tensor(starts, dtype=torch.int32),
            query_start_loc_cpu=starts,
        )
        for i, x in enumerate(whole):
            gi, bi = gdn_gating(x[3], x[4], whole[0][5], whole[0][6])
            ref, _ = hf_rule(*x[:3], gi, bi, torch.zeros(HV, DK, DV), chunked=False)
            a, n = lo[i], counts[i]
            torch.testing.assert_close(
                out[starts[i] : starts[i] + n],
                ref[a : a + n],
                atol=1e-4,
                rtol=1e-4,
                msg=lambda m: f"seq {i}: {m}",
            )
    for i, x in enumerate(whole):
        gi, bi = gdn_gating(x[3], x[4], whole[0][5], whole[0][6])
        _, ref_state = hf_rule(*x[:3], gi, bi, torch.zeros(HV, DK, DV), chunked=True)
        torch.testing.assert_close(states[int(slots[i])], ref_state, atol=1e-4, rtol=1e-4)
    assert not states[[3, 6]].any()


def test_decode_step_matches_the_recurrence():
    """Rows of several sequences, one token each, from their slots: the fused gating and
    update equal transformers' recurrent form one token at a time; the dummy slot's row takes
    whatever a padding row writes and no other slot changes."""
    n = 3
    q, k, v, a, b, A_log, dt_bias = inputs(n, seed=21)
    states = torch.randn(5, HV, DK, DV, generator=torch.Generator().manual_seed(2)) * 0.2
    before = states.clone()
    slots = torch.tensor([3, 0, 1])
    out = gated_delta_step(q, k, v, a, b, A_log, dt_bias, states, slots)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    for i, slot in enumerate(slots.tolist()):
        ref, ref_state = hf_rule(
            q[i : i + 1],
            k[i : i + 1],
            v[i : i + 1],
            g[i : i + 1],
            beta[i : i + 1],
            before[slot],
            chunked=False,
        )
        torch.testing.assert_close(out[i], ref[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[slot], ref_state, atol=1e-5, rtol=1e-5)
    assert torch.equal(states[[2, 4]], before[[2, 4]])


def test_bad_shapes_are_named():
    q, k, v, a, b, A_log, dt_bias = inputs(4, seed=1)
    states = torch.zeros(2, HV, DK, DV)
    with pytest.raises(ValueError, match="state: expected float32"):
        gated_delta_step(q, k, v, a, b, A_log, dt_bias, states.half(), torch.tensor([0] * 4))
    with pytest.raises(ValueError, match="v: expected"):
        chunk_gated_delta_rule(
            q, k, v[:, :3], a, b, states, torch.tensor([0]), torch.tensor([0, 4])
        )
    with pytest.raises(ValueError, match="slots: expected one per row"):
        gated_delta_step(q, k, v, a, b, A_log, dt_bias, states, torch.tensor([0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gated_rms_norm_matches_transformers(dtype):
    gen = torch.Generator().manual_seed(0)
    ref = hf.Qwen3NextRMSNormGated(24, eps=1e-6)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.3 * torch.randn(24, generator=gen))
    ref = ref.to(dtype)
    x = (torch.randn(7, 3, 24, generator=gen) * 3).to(dtype)
    z = torch.randn(7, 3, 24, generator=gen).to(dtype)
    with torch.no_grad():
        expected = ref(x, z)
    torch.testing.assert_close(gated_rms_norm(x, z, ref.weight, 1e-6), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="z: expected the shape"):
        gated_rms_norm(x, z[:, :2], ref.weight, 1e-6)


# -- the short causal convolution -------------------------------------------------------------

C, K = 12, 4


def hf_conv(x, weight, state, activation="silu"):
    """transformers' conv over one sequence ``x`` [L, C] after ``state`` [K-1, C] (its update
    function, whose state holds K inputs: the oldest is a zero it never reads)."""
    full = torch.cat([torch.zeros(1, C), state]).T[None].clone()  # [1, C, K]
    out = hf.causal_conv1d_update(x.T[None], full, weight, None, activation=activation)
    return out[0].T, full[0, :, 1:].T


@pytest.mark.parametrize("bias", [False, True])
def test_conv_matches_transformers(bias):
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(C, K, generator=gen)
    b = torch.randn(C, generator=gen) if bias else None
    lengths, more = [1, 7, 2, 0], [1, 3, 1, 5]
    slots = torch.tensor([1, 3, 0, 2])
    seqs = [torch.randn(n + m, C, generator=gen) for n, m in zip(lengths, more)]
    state = torch.zeros(5, K - 1, C)
    for lo, counts in [([0] * 4, lengths), (lengths, more)]:
        parts = [s[a : a + n] for s, a, n in zip(seqs, lo, counts)]
        starts = [0]
        for n in counts:
            starts.append(starts[-1] + n)
        out = causal_conv1d(
            torch.cat(parts),
            weight,
            b,
            state,
            slots,
            torch.tensor(starts, dtype=torch.int32),
            query_start_loc_cpu=starts,
        )
        for i, s in enumerate(seqs):
            end = lo[i] + counts[i]
            if not counts[i]:
                continue
            ref = F.silu(
                F.conv1d(s[:end].T[None], weight[:, None], b, padding=K - 1, groups=C)[0, :, :end].T
            )
            torch.testing.assert_close(out[starts[i] : starts[i + 1]], ref[lo[i] : end])
    for i, s in enumerate(seqs):
        if bias:
            continue
        # transformers' update from a zero state over the whole sequence: the same state
        ref_out, ref_state = hf_conv(s, weight, torch.zeros(K - 1, C))
        torch.testing.assert_close(state[int(slots[i])], ref_state)
    assert not state[4].any()


def test_conv_update_equals_one_token_chunks_and_transformers():
    gen = torch.Generator().manual_seed(5)
    weight, b = torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    state = torch.randn(4, K - 1, C, generator=gen)
    before = state.clone()
    x = torch.randn(3, C, generator=gen)
    slots = torch.tensor([2, 0, 3])
    other = state.clone()
    out = causal_conv1d_update(x, weight, b, state, slots)
    ref = causal_conv1d_ref(x, weight, b, other, slots, [0, 1, 2, 3])
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(state, other)
    assert torch.equal(state[1], before[1])
    unbiased = causal_conv1d_update(x, weight, None, before.clone(), slots)
    for i, slot in enumerate(slots.tolist()):
        ref_out, _ = hf_conv(x[i : i + 1], weight, before[slot])
        torch.testing.assert_close(unbiased[i], ref_out[0])
    with pytest.raises(ValueError, match="conv_state: expected"):
        causal_conv1d_update(x, weight, b, state[:, :2], slots)
