"""Attention-backend selection checks the KV codec's cache layout of every layer shape of the
model, not only the first layer's: a model of two head sizes (Gemma 4: 256-wide sliding layers
first, 512-wide full layers after) over a codec a backend keeps for the first size only goes
to another backend at start-up, not to a failure inside the first step."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

import tallow.builtins
from tallow.config import config_from_mapping
from tallow.engine.backend_selection import select_attention_backend
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.layers import Attention
from tallow.layers.torch_attention import TorchAttentionBackend
from tallow.plugin import AttentionBackendRegistry


class NarrowCaches(TorchAttentionBackend):
    """Keeps K/V only for heads of up to 8 features (as a codec's kernels may stop at a head
    size), whatever layers it is asked to run."""

    name = "narrow"

    def supports_kv_codec(self, codec, layout):
        wide = [spec.name for spec in layout if spec.shape[-1] > 8]
        return [f"tensors {wide} wider than 8"] if wide else []


def select(head_dims: list[int]) -> str:
    registry = AttentionBackendRegistry()
    tallow.builtins.tallow_register_attention_backends(registry)
    registry.register("narrow", NarrowCaches, priority=100)
    model = nn.ModuleList([Attention(i, 4, 2, d, scale=0.5) for i, d in enumerate(head_dims)])
    loaded = SimpleNamespace(model=model, dtype=torch.float32)
    config = config_from_mapping({"model": {"device": "cpu"}})
    entry, _ = select_attention_backend(
        SimpleNamespace(attention_backends=registry),
        config,
        loaded,  # type: ignore[arg-type]
        "auto",
        AutoKVCodec(),
        block_size=4,
    )
    return entry.name


def test_every_layer_shapes_layout_is_checked():
    assert select([8, 8]) == "narrow"
    assert select([8, 16]) == "torch"  # the second layer's cache is wider than it keeps
    assert select([16, 8]) == "torch"
