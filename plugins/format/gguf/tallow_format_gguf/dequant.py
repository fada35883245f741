"""GGUF tensors to float32 arrays, through the ``gguf`` package's numpy dequantizers, and
block-quantized tensors as they are stored.

GGUF records dimensions fastest-first (``ne[0]`` is the row length), so a matrix stored as
``[in, out]`` in GGUF order is ``[out, in]`` in numpy/torch order: the orientation of a Hugging
Face ``nn.Linear`` weight. The reader already exposes the data in that order; here only the
block-quantized byte rows are expanded back to values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Plain integer/float storage that the gguf dequantizers do not handle: widened directly.
_PLAIN_CASTS = {"F64", "I8", "I16", "I32", "I64"}


def logical_shape(tensor: Any) -> tuple[int, ...]:
    """The tensor's shape in torch order (slowest dimension first)."""
    return tuple(int(d) for d in reversed(list(tensor.shape)))


def dequantize(tensor: Any) -> np.ndarray:
    """A writable float32 array of ``tensor`` (a ``gguf`` ReaderTensor) in torch order.

    Raises ``ValueError`` naming the tensor and its type when the type has no dequantizer.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    qtype = GGMLQuantizationType(int(tensor.tensor_type))
    shape = logical_shape(tensor)
    if qtype.name in _PLAIN_CASTS:
        out = np.asarray(tensor.data).astype(np.float32)
    else:
        try:
            out = gguf_dequantize(tensor.data, qtype)
        except NotImplementedError as exc:
            raise ValueError(
                f"tensor {tensor.name!r}: GGUF type {qtype.name} cannot be dequantized by the "
                f"installed gguf package ({exc})"
            ) from exc
        # F32 comes back as a view of the read-only memory map; torch needs its own memory.
        if qtype == GGMLQuantizationType.F32 or out.dtype != np.float32:
            out = np.array(out, dtype=np.float32)
    if out.size != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(
            f"tensor {tensor.name!r}: dequantized {out.size} values, expected shape {shape}"
        )
    return out.reshape(shape)


def type_name(tensor: Any) -> str:
    """The GGML type name of a reader tensor (``"Q4_K"``, ``"F32"``, ...)."""
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(int(tensor.tensor_type)).name


#: GGML types read as plain float tensors; every other type is block-quantized
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


def is_block_quantized(tensor: Any) -> bool:
    """Whether ``tensor`` (a reader tensor) is stored in GGML blocks (Q4_K, Q8_0, ...)."""
    name = type_name(tensor)
    return name not in FLOAT_TYPES and name not in _PLAIN_CASTS


def dequantize_blocks(data: Any, qtype: str, shape: tuple[int, ...]) -> Any:
    """float32 torch tensor of ``shape`` from GGML blocks of ``qtype`` (``data``: a uint8
    torch tensor, one row of blocks per logical row); the dequantizer of the
    :class:`tallow.layers.QuantizedWeight` a checkpoint yields."""
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    out = gguf_dequantize(data.cpu().numpy(), GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32).reshape(shape))
