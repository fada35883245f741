"""KV sharing: :class:`~tallow.layers.SharedKVAttention` attends over an earlier layer's
cache, keeps none of its own and stores nothing; backends without ``supports_kv_sharing`` are
refused such models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tallow.engine.backend_selection import backend_refusals
from tallow.engine.cache_groups import GroupCaches, find_cache_groups
from tallow.engine.kv_manager import PagedGroupSize
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.layers import (
    Attention,
    AttentionMetadata,
    SharedKVAttention,
    forward_context,
    shared_kv_layers,
)
from tallow.layers.torch_attention import TorchAttentionBackend
from tallow.plugin.testing.seeds import seed_of
from tallow.types import AttentionBackend

HQ, HKV, D, WINDOW, BLOCK = 4, 2, 8, 5, 4


def model() -> nn.ModuleList:
    """Layers 0 (full) and 1 (window 5) keep K/V; 2 reads layer 0's, 3 layer 1's."""
    full = Attention(0, HQ, HKV, D, scale=0.5)
    local = Attention(1, HQ, HKV, D, scale=0.5, sliding_window=WINDOW)
    return nn.ModuleList(
        [
            full,
            local,
            SharedKVAttention(2, full, HQ // 2, scale=0.7),
            SharedKVAttention(3, local, HQ, scale=0.3, logit_softcap=2.0),
        ]
    )


def dense_reference(q, k, v, *, scale, window=None, softcap=None):
    """Causal attention of ``q [T, Hq, D]`` over ``k``/``v [T, Hkv, D]`` of one sequence."""
    t, hq = q.shape[0], q.shape[1]
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    pos = torch.arange(t)
    allowed = pos[None, :] <= pos[:, None]
    if window:
        allowed &= pos[:, None] - pos[None, :] < window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float())


def test_shared_layers_take_no_cache_and_read_their_sources_group():
    layers = model()
    groups = find_cache_groups(layers)
    assert [[a.layer.layer_index for a in g.layers] for g in groups] == [[0], [1]]
    assert [s.layer.layer_index for s in shared_kv_layers(layers)] == [2, 3]
    shared = layers[3].layer
    # the source's KV heads, head size and window; its own heads, scale and softcap
    assert (shared.num_kv_heads, shared.head_dim, shared.sliding_window) == (HKV, D, WINDOW)
    assert (shared.num_heads, shared.scale, shared.logit_softcap) == (HQ, 0.3, 2.0)
    assert shared.kv_shared_from == 1 and layers[2].layer.kv_shared_from == 0
    assert layers[3].state_dict() == {}  # the source is not its child


def test_shared_layers_attend_over_the_source_cache_and_store_nothing():
    """Two steps (a prefill past the window, then a decode) through the torch backend on the
    engine's group caches: each shared layer's output is dense attention of its queries over
    its source's K/V, and its calls leave every cache as the source left it."""
    layers = model()
    caches = GroupCaches(
        layers,
        AutoKVCodec(),
        num_blocks=8,
        block_size=BLOCK,
        dtype=torch.float32,
        device=torch.device("cpu"),
        num_slots=1,
        group_sizes=[PagedGroupSize(8), PagedGroupSize(8, WINDOW)],
    )
    assert caches.paged[1][0] is layers[1].kv_cache and layers[1].cache_group == 1
    g = torch.Generator().manual_seed(seed_of("kv-sharing"))
    total = 11
    k = torch.randn(total, HKV, D, generator=g)
    v = torch.randn(total, HKV, D, generator=g)
    q = {i: torch.randn(total, layers[i].layer.num_heads, D, generator=g) for i in (2, 3)}
    tables = [
        torch.tensor([[3, 1, 6]], dtype=torch.int32),
        torch.tensor([[5, 0, 2]], dtype=torch.int32),
    ]
    backend = TorchAttentionBackend()
    done = 0
    for n in (10, 1):
        rows = slice(done, done + n)
        pos = torch.arange(done, done + n)
        slots = tables[0][0, pos // BLOCK].long() * BLOCK + pos % BLOCK
        views = []
        for table in tables:
            views.append(
                AttentionMetadata(
                    num_seqs=1,
                    num_tokens=n,
                    query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                    seq_lens=torch.tensor([done + n], dtype=torch.int32),
                    block_tables=table,
                    slot_mapping=table[0, pos // BLOCK].long() * BLOCK + pos % BLOCK,
                    max_query_len=n,
                    max_seq_len=done + n,
                    block_size=BLOCK,
                    query_start_loc_cpu=[0, n],
                    seq_lens_cpu=[done + n],
                )
            )
        meta = views[0]
        meta.slot_mapping = slots
        meta.group_views = views
        with forward_context(meta, backend):
            for source in (0, 1):  # their queries do not matter here
                layers[source](
                    torch.zeros(n, HQ * D), k[rows].reshape(n, -1), v[rows].reshape(n, -1)
                )
            before = [c["k"].clone() for group in caches.paged for c in group]
            before += [c["v"].clone() for group in caches.paged for c in group]
            out = {i: layers[i](q[i][rows].reshape(n, -1)) for i in (2, 3)}
            after = [c["k"] for group in caches.paged for c in group]
            after += [c["v"] for group in caches.paged for c in group]
        assert all(torch.equal(a, b) for a, b in zip(after, before)), "a shared layer stored K/V"
        seen = slice(0, done + n)
        want2 = dense_reference(q[2][seen], k[seen], v[seen], scale=0.7)[-n:]
        want3 = dense_reference(
            q[3][seen], k[seen], v[seen], scale=0.3, window=WINDOW, softcap=2.0
        )[-n:]
        torch.testing.assert_close(out[2].view(n, -1, D), want2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[3].view(n, -1, D), want3, rtol=1e-5, atol=1e-5)
        done += n
    # the window matters here: full attention over layer 1's K/V gives another answer
    full = dense_reference(q[3][:11], k[:11], v[:11], scale=0.3, softcap=2.0)[-1:]
    assert float((out[3].view(1, -1, D) - full).abs().max()) > 1e-3


class _NoSharing(AttentionBackend):
    name = "no-sharing"

    def forward(self, layer, q, k, v, kv_cache, meta):  # pragma: no cover - never run
        raise AssertionError


def test_backends_without_kv_sharing_are_refused_by_layer():
    specs = [m.layer for m in model() if hasattr(m, "layer")]
    codec = AutoKVCodec()
    refused = backend_refusals(_NoSharing(), specs, "auto", codec, [], 2)
    assert any("KV-sharing" in r and "[2, 3]" in r for r in refused), refused
    assert backend_refusals(TorchAttentionBackend(), specs, "auto", codec, [], 2) == []


def test_bad_sources_are_refused():
    full = Attention(3, HQ, HKV, D)
    with pytest.raises(ValueError, match="must come earlier"):
        SharedKVAttention(2, full, HQ)
    with pytest.raises(ValueError, match="not a multiple"):
        SharedKVAttention(4, full, 3)
    with pytest.raises(TypeError, match="must be an Attention"):
        SharedKVAttention(5, SharedKVAttention(4, full, HQ), HQ)  # type: ignore[arg-type]


def test_unbound_source_is_a_clear_error():
    layers = model()
    meta = AttentionMetadata(
        num_seqs=1,
        num_tokens=1,
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([1], dtype=torch.int32),
        block_tables=torch.zeros(1, 1, dtype=torch.int32),
        slot_mapping=torch.zeros(1, dtype=torch.int64),
        max_query_len=1,
        max_seq_len=1,
        block_size=BLOCK,
    )
    with forward_context(meta, TorchAttentionBackend()):
        with pytest.raises(RuntimeError, match="layer 0, which has no KV cache bound"):
            layers[2](torch.zeros(1, HQ // 2 * D))
