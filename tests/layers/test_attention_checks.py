"""The checks every paged attention backend shares (tallow.layers.attention_checks) and the
CUDA device check of their selection (tallow.kernels.cuda_device): each names what does not
fit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tallow.kernels.cuda_device import cuda_device_reasons, cuda_index
from tallow.layers import AttentionLayer
from tallow.layers.attention_checks import check_rows, layer_reasons, qkv_shape_reasons


def _layer(**kw) -> AttentionLayer:
    facts = dict(layer_index=3, num_heads=4, num_kv_heads=2, head_dim=8, scale=0.5)
    facts.update(kw)
    return AttentionLayer(**facts)


def test_layer_reasons():
    assert layer_reasons(_layer()) == []
    assert layer_reasons(_layer(num_heads=6, num_kv_heads=4)) == [
        "num_heads 6 is not a multiple of num_kv_heads 4"
    ]
    assert layer_reasons(_layer(num_kv_heads=0)) == [
        "num_heads 4 is not a multiple of num_kv_heads 0"
    ]
    assert layer_reasons(_layer(causal=False, sliding_window=16)) == [
        "a sliding window on a bidirectional (causal=False) layer"
    ]
    assert layer_reasons(_layer(sliding_window=16)) == []
    # a backend whose kernels do not mask by chunk refuses the layer rather than ignore it
    assert layer_reasons(_layer(attention_chunk_size=32)) == [
        "chunked local attention (attention_chunk_size 32)"
    ]
    assert layer_reasons(_layer(attention_chunk_size=32), chunks=True) == []
    assert layer_reasons(_layer(attention_chunk_size=32, sliding_window=8), chunks=True) == [
        "chunked local attention (attention_chunk_size 32) together with a sliding window (8)"
    ]


def test_rows_and_shapes():
    layer = _layer()
    q, k, v = torch.zeros(5, 4, 8), torch.zeros(5, 2, 8), torch.zeros(5, 2, 8)
    meta = SimpleNamespace(slot_mapping=torch.zeros(5, dtype=torch.int64))
    check_rows("mine", layer, q, k, v, meta)
    with pytest.raises(
        ValueError,
        match=r"mine attention, layer 3: q, k, v and "
        r"meta.slot_mapping must have the same number of "
        r"rows, got 5, 4, 5, 5",
    ):
        check_rows("mine", layer, q, k[:4], v, meta)
    assert qkv_shape_reasons(layer, q, k, v, contiguous_heads=True) == []
    assert qkv_shape_reasons(layer, q.reshape(5, 2, 16), k, v[..., :4]) == [
        "q must be [T, 4, 8], got [5, 2, 16]",
        "v must be [T, 2, 8], got [5, 2, 4]",
    ]
    strided = torch.zeros(5, 4, 16)[..., ::2]
    assert qkv_shape_reasons(layer, strided, k, v) == []
    assert qkv_shape_reasons(layer, strided, k, v, contiguous_heads=True) == [
        "q must be [T, 4, 8] with contiguous heads, got [5, 4, 8]"
    ]


def test_cuda_device_reasons(monkeypatch):
    assert (cuda_index("cuda:2"), cuda_index("cuda"), cuda_index("auto")) == (2, None, None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_device_reasons("cuda", (8, 0)) == (
        ["no CUDA device (torch.cuda.is_available() is False)"],
        None,
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    asked: list[int] = []

    def capability_of(index: int) -> tuple[int, int]:
        asked.append(index)
        return (7, 5) if index == 0 else (9, 0)

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability_of)
    assert cuda_device_reasons("cuda:2", (8, 0)) == (
        ["model.device 'cuda:2' does not exist (2 CUDA device(s))"],
        None,
    )
    assert cuda_device_reasons("auto", (8, 0)) == (
        ["CUDA compute capability 7.5 is below 8.0"],
        (7, 5),
    )
    assert cuda_device_reasons("cuda:1", (8, 0)) == ([], (9, 0))
    assert asked == [0, 1]


def test_attention_chunk_size_is_checked_and_carried():
    """``Attention(attention_chunk_size=)`` reaches the layer facts the backends read; a chunk
    on a bidirectional layer, or of no tokens, is refused by name."""
    from tallow.layers import Attention

    attn = Attention(0, 4, 2, 8, attention_chunk_size=16)
    assert attn.layer.attention_chunk_size == 16 and "chunk=16" in attn.extra_repr()
    assert Attention(0, 4, 2, 8).layer.attention_chunk_size is None
    for bad in (dict(attention_chunk_size=0), dict(attention_chunk_size=8, causal=False)):
        with pytest.raises(ValueError, match="attention_chunk_size"):
            Attention(0, 4, 2, 8, **bad)


def test_chunked_layers_go_only_to_backends_that_mask_by_chunk():
    """The engine's backend choice: a backend that does not set ``supports_chunked_attention``
    is refused a model with chunked layers, naming them (so a backend written before chunks
    existed cannot compute full attention over them); one that sets it is not."""
    from tallow.engine.backend_selection import backend_refusals
    from tallow.kernels.kv_cast import AutoKVCodec
    from tallow.layers.torch_attention import TorchAttentionBackend
    from tallow.types import AttentionBackend

    class Unaware(AttentionBackend):
        name = "unaware"

        def forward(self, layer, q, k, v, kv_cache, meta):  # pragma: no cover - never run
            raise AssertionError

    layers = [_layer(layer_index=0), _layer(layer_index=1, attention_chunk_size=8)]
    codec = AutoKVCodec()
    refused = backend_refusals(Unaware(), layers, "auto", codec, [])
    assert refused == [
        "cannot run chunked local attention (each query over its own chunk), which layers [1] "
        "of this model have"
    ]
    assert backend_refusals(TorchAttentionBackend(), layers, "auto", codec, []) == []
