"""A KV cache stored in float16 whatever the model's dtype: half the memory of a float32
model's cache, and bfloat16 models keep three more mantissa bits (values beyond float16's
range, +-65504, are not expected in keys and values).

It is elementwise: each element is rounded to nearest in float16 and widened when read, so
every attention backend that reads a float16 cache serves it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from tallow.plugin import KVCodec


class Float16KVCodec(KVCodec):
    name: ClassVar[str] = "{{ cookiecutter.component_name }}"
    bytes_per_element: ClassVar[float] = 2.0

    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return torch.float16
