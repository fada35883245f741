"""In-situ quantization (``model.isq``): a float weight → packed GGML blocks, on the device.

The layer's loader calls :func:`quantize_rows` with each float tensor as it arrives (a
safetensors or F16/BF16/F32 GGUF checkpoint, or the rows a ``random:`` model draws), so the
model never exists as a whole in float: memory stays near the quantized size plus one tensor.
The bytes come from :func:`tallow_quant_gguf.quantize.quantize` (llama.cpp's reference
algorithms for the k-quants, ``gguf.quants``' bytes for the others), then are packed for the
kernels like a GGUF file's blocks.
"""

from __future__ import annotations

import torch

from .packing import PackedWeight, pack
from .qtypes import quant_type
from .quantize import quantize
from .scheme import isq_storage_type


def quantize_rows(weight: torch.Tensor, isq: str, role: str,
                  device: torch.device) -> PackedWeight:
    """``weight`` (float ``[rows, cols]``, any device and dtype) quantized on ``device`` to the
    type :func:`~tallow_quant_gguf.scheme.isq_storage_type` gives ``isq`` for a layer of
    ``role`` (``"linear"``, ``"head"``, ``"embedding"``) and these columns."""
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"model.isq {isq}: expected a 2-d float weight, got {weight.dtype} of "
                         f"shape {tuple(weight.shape)}")
    name = isq_storage_type(isq, role, weight.shape[1])
    blocks = quantize(weight.to(device), name)
    return pack(blocks, quant_type(name), cols=weight.shape[1])
