"""The default KV codec: K and V stored in the model's own dtype."""

from __future__ import annotations

from typing import ClassVar

import torch

from tallow.plugin import KVCodec


class AutoKVCodec(KVCodec):
    name: ClassVar[str] = "auto"
    bytes_per_element: ClassVar[float] = 2.0

    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return model_dtype
