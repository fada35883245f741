"""8-bit float KV caches: each K/V element rounded to float8, no scales.

Both are elementwise codecs (:class:`tallow.plugin.KVCodec`): a value is clamped to the
format's largest finite magnitude (448 for e4m3, 57344 for e5m2; neither format has an
infinity, so an overflowing cast would give NaN), rounded to nearest even and widened back to
the activations' dtype when read. Every attention backend that reads a cache of these dtypes
serves them; the core's torch backend and tallow-attention-triton do.

e4m3 keeps 3 mantissa bits over a range of +-448, e5m2 2 bits over +-57344. Keys and values of
common models lie well inside +-448 (they come out of a normalised hidden state through one
projection), so ``fp8`` (e4m3) is the default choice; ``fp8_e5m2`` is for models whose keys or
values are known to be larger.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from tallow.plugin import KVCodec


class FP8E4M3KVCodec(KVCodec):
    name: ClassVar[str] = "fp8"
    bytes_per_element: ClassVar[float] = 1.0

    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return torch.float8_e4m3fn


class FP8E5M2KVCodec(KVCodec):
    name: ClassVar[str] = "fp8_e5m2"
    bytes_per_element: ClassVar[float] = 1.0

    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return torch.float8_e5m2
