"""8-bit float KV caches: each K/V element rounded to float8.

Both codecs cast (:class:`tallow.kernels.kv_cast.CastKVCodec`): a value is clamped to the
format's largest finite magnitude (448 for e4m3, 57344 for e5m2; neither format has an
infinity, so an overflowing cast would give NaN), rounded to nearest even and widened back
when read. The core's torch backend serves them through the codec's reference; the Triton
attention backend implements them in its kernels.

With the setting ``scales: checkpoint`` the layout adds a scale per KV head for keys and one
for values (:class:`~tallow.kernels.kv_cast.CastKVCodec` ``per_head_scales``), read from the
checkpoint's ``self_attn.k_scale``/``v_scale``: values are divided by them before the cast.
With ``center_keys: true`` each key is stored less its head's calibrated mean key.

e4m3 keeps 3 mantissa bits over a range of +-448, e5m2 2 bits over +-57344. Keys and values of
common models lie well inside +-448 (they come out of a normalised hidden state through one
projection), so ``fp8`` (e4m3) is the default choice; ``fp8_e5m2`` is for models whose keys or
values are known to be larger.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tallow.kernels import CastKVCodec

from .settings import fp8_settings


class FP8KVCodec(CastKVCodec):
    """A cast into an 8-bit float, with the checkpoint's scales and centred keys when the
    settings ask."""

    def __init__(self, config: Any = None) -> None:
        settings = fp8_settings(config)
        super().__init__(
            config,
            per_head_scales=settings.scales == "checkpoint",
            center_keys=settings.center_keys,
        )


class FP8E4M3KVCodec(FP8KVCodec):
    name: ClassVar[str] = "fp8"
    bits_per_element: ClassVar[float] = 8.0
    storage: ClassVar[torch.dtype | None] = torch.float8_e4m3fn


class FP8E5M2KVCodec(FP8KVCodec):
    name: ClassVar[str] = "fp8_e5m2"
    bits_per_element: ClassVar[float] = 8.0
    storage: ClassVar[torch.dtype | None] = torch.float8_e5m2
