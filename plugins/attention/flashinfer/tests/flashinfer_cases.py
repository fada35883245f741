"""What the GPU tests run, in one place: every layer shape and backend setting they use, so that
the FlashInfer modules these need (a few minutes of nvcc each when compiled one after
another) are compiled at once, in parallel, when the session starts (conftest.py), and so
that the tests share them: few distinct modules, many checks each.

Modules (sm_90): the bf16 head-size-128 decode, FA2 and FA3 modules (llama-3-8b and
qwen3-0.6b shapes, default settings: the benchmarks' modules too); and, with every step on FA2
(``FA2_ONLY``), fp16 at head size 64, bf16 at head size 256 with a window and softcap, and bf16
over an e4m3 and an e5m2 cache at head size 128.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

#: settings of the backend that runs every step on FlashInfer's FA2 kernels
FA2_ONLY = {"prefill_backend": "fa2", "decode_tensor_cores": "always"}
DEFAULT: dict[str, Any] = {}

#: (heads, kv heads, head size, dtype, cache dtype, window, softcap, settings)
SHAPES = {
    "llama-3-8b": (32, 8, 128, torch.bfloat16, torch.bfloat16, None, None, DEFAULT),
    "qwen3-0.6b": (16, 8, 128, torch.bfloat16, torch.bfloat16, None, None, DEFAULT),
    "fp16-hd64-gqa8": (16, 2, 64, torch.float16, torch.float16, None, None, FA2_ONLY),
    "hd256-window-softcap": (8, 4, 256, torch.bfloat16, torch.bfloat16, 48, 30.0, FA2_ONLY),
    "fp8-e4m3": (32, 8, 128, torch.bfloat16, torch.float8_e4m3fn, None, None, FA2_ONLY),
    "fp8-e5m2": (32, 8, 128, torch.bfloat16, torch.float8_e5m2, None, None, FA2_ONLY),
}

needs_gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer"),
]


def config(settings: dict[str, Any]) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        model=SimpleNamespace(device="cuda", dtype="auto"),
        plugins=SimpleNamespace(settings={"tallow-attention-flashinfer": dict(settings)}),
    )


def backend(settings: dict[str, Any]) -> Any:
    from tallow_attention_flashinfer.backend import FlashInferAttentionBackend

    return FlashInferAttentionBackend(config(settings))


def all_jit_specs() -> list[Any]:
    """FlashInfer's JIT specs of every module the GPU tests load (on this GPU)."""
    from tallow.layers import AttentionLayer
    from tallow_attention_flashinfer.kinds import (
        LayerKind,
        decode_on_tensor_cores,
        jit_specs,
        prefill_kernels,
    )

    capability = torch.cuda.get_device_capability()
    specs = {}
    for heads, kv_heads, head_dim, dtype, cache_dtype, window, softcap, settings in SHAPES.values():
        layer = AttentionLayer(
            0,
            heads,
            kv_heads,
            head_dim,
            head_dim**-0.5,
            sliding_window=window,
            logit_softcap=softcap,
        )
        kind = LayerKind.of(layer, dtype, cache_dtype)  # bidirectional layers: same modules
        full = {"prefill_backend": "auto", "decode_tensor_cores": "auto", **settings}
        for spec in jit_specs(
            kind,
            prefill_kernels(kind, full["prefill_backend"], capability),
            decode_on_tensor_cores(kind, full["decode_tensor_cores"]),
        ):
            specs.setdefault(spec.name, spec)
    return list(specs.values())
