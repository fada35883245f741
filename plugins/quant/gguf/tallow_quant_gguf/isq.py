"""In-situ quantization (``model.isq``): a float weight → packed GGML blocks, on the device.

The layer's loader calls :func:`quantize_rows` with each float tensor as it arrives (a
safetensors or F16/BF16/F32 GGUF checkpoint, or the rows a ``random:`` model draws), so the
model never exists as a whole in float: memory stays near the quantized size plus one tensor.
The bytes come from :func:`tallow_quant_gguf.quantize.quantize` (llama.cpp's reference
algorithms for the k-quants, ``gguf.quants``' bytes for the others), then are packed for the
kernels like a GGUF file's blocks. Every matrix takes the requested type (embedding and head
included); ``tallow quantize`` instead follows llama.cpp's per-tensor rules.
"""

from __future__ import annotations

import torch

from .packing import PackedWeight, dense, pack
from .qtypes import quant_type
from .quantize import quantize
from .quantize_mix import with_shape_fallback


def quantize_rows(
    weight: torch.Tensor, isq: str, device: torch.device, dtype: torch.dtype
) -> PackedWeight:
    """``weight`` (float ``[rows, cols]``, any device and dtype) quantized on ``device`` to
    ``isq``, or to llama.cpp's fallback type when its rows are not whole blocks of ``isq``
    (the fallback ``tallow quantize`` applies too); rows that
    not even 32-element blocks fit stay dense, in ``dtype``."""
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(
            f"model.isq {isq}: expected a 2-d float weight, got {weight.dtype} of "
            f"shape {tuple(weight.shape)}"
        )
    name = with_shape_fallback(isq, weight.shape[1])
    if name == "f16":  # no block type fits the rows
        return dense(weight.to(device, dtype))
    blocks = quantize(weight.to(device), name)
    return pack(blocks, quant_type(name), cols=weight.shape[1])
