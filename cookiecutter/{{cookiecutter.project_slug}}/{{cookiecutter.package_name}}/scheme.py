"""Int8 weights with one float32 scale per row: ``w[r, c] = q[r, c] * scale[r]``.

The scheme quantizes float weights at load (``model.isq: int8_row``) and accepts checkpoint
tensors already in its encoding (:class:`tallow.layers.QuantizedWeight` of scheme
``"{{ cookiecutter.component_name }}"``, type ``"int8_row"``: each row's ``cols`` int8 bytes
followed by its float32 scale, see :func:`quantize`). Loading goes through the layer's own
loader (which knows tensor-parallel shards), then :meth:`RowInt8Method.process_weights_after_
loading` keeps only the int8 rows and their scales.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tallow.layers import LinearMethod, QuantizedWeight, set_weight_attrs
from tallow.plugin import QuantScheme

SCHEME = "{{ cookiecutter.component_name }}"
QTYPE = "int8_row"


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 ``q``, float32 ``scale``) with ``q * scale[:, None]`` closest to ``w``."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize(data: torch.Tensor, qtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The float32 weight of ``data`` (one row of bytes per matrix row)."""
    if qtype != QTYPE:
        raise ValueError(f"{SCHEME}: unknown type {qtype!r} (expected {QTYPE!r})")
    cols = shape[-1]
    q = data[:, :cols].contiguous().view(torch.int8).float()
    scale = data[:, cols:cols + 4].contiguous().view(torch.float32)
    return q * scale


def quantize(w: torch.Tensor) -> QuantizedWeight:
    """``w [rows, cols]`` as a checkpoint tensor in this scheme's encoding."""
    q, scale = quantize_rows(w)
    data = torch.cat([q.view(torch.uint8), scale[:, None].contiguous().view(torch.uint8)], 1)
    return QuantizedWeight(SCHEME, QTYPE, tuple(w.shape), data, dequantize)


class RowInt8Method(LinearMethod):
    """Loads float rows (dequantizing checkpoint tensors of this scheme), then keeps int8."""

    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype, device: torch.device) -> None:
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=torch.float32,
                                          device=device), requires_grad=False)

        def load(param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
            if isinstance(loaded, QuantizedWeight):
                loaded = loaded.dequantize()
            layer.weight_loader(param, loaded, shard_id)

        set_weight_attrs(weight, output_dim=0, input_dim=1, accepts_quantized=True,
                         weight_loader=load)
        layer.register_parameter("weight", weight)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scale = quantize_rows(layer.weight.data)
        layer.register_buffer("qweight", q)
        layer.register_buffer("scale", scale)
        layer.weight.data = torch.empty(0, device=q.device)  # the float copy is not kept

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        y = F.linear(x, layer.qweight.to(x.dtype)) * layer.scale.to(x.dtype)
        return y if bias is None else y + bias


class RowInt8Scheme(QuantScheme):
    name: ClassVar[str] = SCHEME
    isq_types: ClassVar[tuple[str, ...]] = (QTYPE,)

    @classmethod
    def detect(cls, config: dict[str, Any]) -> bool:
        """Asked of checkpoints whose quant_method this scheme serves (see plugin.py): they
        are its own when they store 8-bit rows; another scheme may claim the others."""
        quant = config.get("quantization_config") or {}
        return quant.get("format", QTYPE) == QTYPE

    def use_checkpoint_config(self, config: dict[str, Any]) -> None:
        """Reads how the claimed checkpoint stores its weights, refusing what this scheme
        cannot serve by the field's name (the engine adds the config file's)."""
        super().use_checkpoint_config(config)
        bits = config["quantization_config"].get("bits", 8)
        if bits != 8:
            raise ValueError(f"quantization_config.bits: expected 8, got {bits!r}")

    def linear_method(self, prefix: str) -> LinearMethod | None:
        return RowInt8Method()
