"""Which attention backend the engine picks for Gemma 4 E2B's layer shapes on a CUDA device,
decided without one (the device's presence and compute capability faked, the model built on
the meta device): the Triton backend serves its 256-wide sliding layers, its 512-wide full
layers and the KV-shared layers reading both."""

from __future__ import annotations

import pytest
import torch

import tallow.builtins
from tallow.config import config_from_mapping
from tallow.engine.backend_selection import select_attention_backend
from tallow.engine.loader import LoadedModel
from tallow.engine.random_shapes import SHAPES
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.layers import ArchConfig, BuildContext, shared_kv_layers
from tallow.plugin import Registries
from tallow_attention_triton import plugin as triton_plugin
from tallow_model_gemma.gemma4 import Gemma4ForCausalLM


@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))


def e2b_layers() -> LoadedModel:
    """random:gemma-4-e2b's attention (35 layers, 20 of them KV-shared; heads of 256 and 512)
    with a narrow residual stream and vocabulary: the layers the selection reads."""
    cfg = dict(SHAPES["gemma-4-e2b"])
    cfg.update(
        hidden_size=64,
        intermediate_size=64,
        vocab_size=300,
        vocab_size_per_layer_input=300,
        hidden_size_per_layer_input=8,
    )
    build = BuildContext(dtype=torch.bfloat16, device=torch.device("meta"))
    model = Gemma4ForCausalLM(ArchConfig(cfg), build)
    return LoadedModel(
        model=model,
        config=ArchConfig(cfg),
        checkpoint=None,  # type: ignore[arg-type]
        architecture=None,  # type: ignore[arg-type]
        dtype=torch.bfloat16,
        device=torch.device("cuda"),
    )


def test_gemma4_e2b_is_served_by_triton(hopper: None) -> None:
    loaded = e2b_layers()
    shared = [s.layer for s in shared_kv_layers(loaded.model)]
    assert len(shared) == 20 and {layer.head_dim for layer in shared} == {256, 512}
    registries = Registries()
    tallow.builtins.tallow_register_attention_backends(registries.attention_backends)
    triton_plugin.tallow_register_attention_backends(registries.attention_backends)
    config = config_from_mapping(
        {"model": {"source": "random:gemma-4-e2b", "device": "cuda", "dtype": "bfloat16"}}
    )
    entry, backend = select_attention_backend(
        registries, config, loaded, "auto", AutoKVCodec(), block_size=16
    )
    assert entry.name == "triton", entry.name
    assert type(backend).__name__ == "TritonAttentionBackend"
