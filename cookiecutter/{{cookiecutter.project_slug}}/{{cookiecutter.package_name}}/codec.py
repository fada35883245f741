"""A KV cache stored in float16 whatever the model's dtype: half the memory of a float32
model's cache, and bfloat16 models keep three more mantissa bits (values beyond float16's
range, +-65504, are not expected in keys and values).

A codec describes the tensors of one attention layer's cache (``layout``: here a ``k`` and a
``v`` tensor of [block_size, KV heads, head size] per block) and gives the plain-torch
reference of writing a step's K/V into them (``encode``) and reading whole blocks back
(``decode``). tallow allocates the tensors, sizes the cache from their bytes and copies their
blocks; its torch attention backend serves any codec through ``encode``/``decode``, and a
faster backend serves it only if it implements the format in its own kernels.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tallow.kernels import slots_to_blocks
from tallow.plugin import KVCodec, KVTensor


class Float16KVCodec(KVCodec):
    name: ClassVar[str] = "{{ cookiecutter.component_name }}"
    bits_per_element: ClassVar[float] = 16.0

    def layout(self, *, num_kv_heads: int, head_dim: int, block_size: int,
               model_dtype: torch.dtype) -> list[KVTensor]:
        block = (block_size, num_kv_heads, head_dim)
        return [KVTensor("k", block, torch.float16), KVTensor("v", block, torch.float16)]

    def encode(self, cache: Any, k: torch.Tensor, v: torch.Tensor,
               slot_mapping: torch.Tensor) -> None:
        # rows with slot -1 (padding) are dropped; the others land at (block, offset)
        rows, blocks, offsets = slots_to_blocks(slot_mapping, cache.block_size)
        cache["k"][blocks, offsets] = k[rows].to(torch.float16)
        cache["v"][blocks, offsets] = v[rows].to(torch.float16)

    def decode(self, cache: Any, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (-1, cache.num_kv_heads, cache.head_dim)
        return (cache["k"][blocks].reshape(shape).float(),
                cache["v"][blocks].reshape(shape).float())
