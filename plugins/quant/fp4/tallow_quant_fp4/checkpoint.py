"""FP4 checkpoints: which format a ``quantization_config`` describes, and its tensors unpacked.

- ``quant_method: mxfp4`` (transformers' Mxfp4Config, as gpt-oss ships it): a quantized
  linear layer stores ``weight_blocks`` (uint8 ``[N, K / 32, 16]``: 32 e2m1 codes per block,
  two per byte, the even element in the low nibble) and ``weight_scales`` (uint8
  ``[N, K / 32]``, e8m0 exponents) — the ``<param>_blocks`` / ``<param>_scales`` naming of
  gpt-oss's experts, for a dense layer's ``weight``.
- ``quant_method: compressed-tensors`` with ``format`` ``nvfp4-pack-quantized`` or
  ``mxfp4-pack-quantized`` (llm-compressor): ``weight_packed`` (uint8 ``[N, K / 2]``, the even
  element in the low nibble), ``weight_scale`` (float8 e4m3 ``[N, K / 16]``; MXFP4: uint8 e8m0
  ``[N, K / 32]``) and, for NVFP4, ``weight_global_scale`` (float32: the scales are divided
  by it). Activation quantization in the config (NVFP4's W4A4) is not applied: the weights are
  decoded in the kernels and the activations stay in the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

CT_FORMATS = {"nvfp4-pack-quantized": "nvfp4", "mxfp4-pack-quantized": "mxfp4"}


@dataclass(frozen=True)
class FP4Layout:
    """How the checkpoint stores a quantized layer."""

    kind: str  # "mxfp4" or "nvfp4": the scale encoding
    method: str
    tensors: tuple[str, ...]
    required: tuple[str, ...]


def _fail(key: str, value: Any, expected: str) -> ValueError:
    return ValueError(
        f"quantization_config.{key}: {value!r} is not supported (expected {expected})"
    )


def _ct_groups(q: dict[str, Any]) -> list[tuple[str, Any]]:
    groups = q.get("config_groups") or {}
    return list(groups.items()) if isinstance(groups, dict) else []


def holds_fp4_weights(config: dict[str, Any]) -> bool:
    """Whether ``config``'s ``quantization_config`` stores FP4 weights this plugin reads."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return False
    if q.get("quant_method") == "mxfp4":
        return True
    if q.get("quant_method") != "compressed-tensors":
        return False
    groups = _ct_groups(q)
    return bool(groups) and all(
        isinstance(s, dict)
        and isinstance(s.get("weights"), dict)
        and s["weights"].get("type") == "float"
        and s["weights"].get("num_bits") == 4
        for _, s in groups
    )


def fp4_layout(config: dict[str, Any]) -> FP4Layout:
    """The layout ``config`` describes; ``ValueError`` naming the field otherwise."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        raise ValueError(
            "quantization_config: expected a mapping describing the quantized "
            f"weights, got {type(q).__name__}"
        )
    method = q.get("quant_method")
    if method == "mxfp4":
        return FP4Layout(
            "mxfp4", method, ("weight_blocks", "weight_scales"), ("weight_blocks", "weight_scales")
        )
    if method != "compressed-tensors":
        raise _fail("quant_method", method, "mxfp4 or compressed-tensors")
    status = q.get("quantization_status", "compressed")
    if status != "compressed":
        raise _fail("quantization_status", status, "compressed: the weights stored packed")
    kinds = set()
    for name, scheme in _ct_groups(q):
        fmt = scheme.get("format") or q.get("format")
        key = f"config_groups.{name}.format" if scheme.get("format") else "format"
        if fmt not in CT_FORMATS:
            raise _fail(key, fmt, " or ".join(CT_FORMATS))
        w = scheme["weights"]
        group = w.get("group_size")
        if group != {"nvfp4": 16, "mxfp4": 32}[CT_FORMATS[fmt]]:
            raise _fail(
                f"config_groups.{name}.weights.group_size", group, "16 for NVFP4, 32 for MXFP4"
            )
        kinds.add(CT_FORMATS[fmt])
    if len(kinds) != 1:
        raise _fail("config_groups", sorted(kinds), "one FP4 format for every group")
    kind = kinds.pop()
    tensors = ("weight_packed", "weight_scale") + (
        ("weight_global_scale",) if kind == "nvfp4" else ()
    )
    return FP4Layout(kind, method, tensors, tensors)


def _codes_of_bytes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K / 2]``, two codes per byte (the even element in the low nibble) →
    ``[N, K]``."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def unpack(
    layout: FP4Layout, t: dict[str, torch.Tensor], shape: tuple[int, int], what: str
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(e2m1 codes ``[N, K]`` uint8, scale bytes ``[N, K / group]``, global scale) of one
    checkpoint weight of logical ``shape``."""
    n, k = shape
    group = 32 if layout.kind == "mxfp4" else 16
    if layout.method == "mxfp4":
        blocks, scales = t["weight_blocks"], t["weight_scales"]
        if (
            tuple(blocks.shape) not in ((n, k // 32, 16), (n, k // 2))
            or blocks.dtype != torch.uint8
        ):
            raise ValueError(
                f"{what}: weight_blocks must be uint8 of shape ({n}, {k // 32}, "
                f"16), got {blocks.dtype} {tuple(blocks.shape)}"
            )
        packed = blocks.reshape(n, k // 2)
        global_scale = 1.0
    else:
        packed, scales = t["weight_packed"], t["weight_scale"]
        if tuple(packed.shape) != (n, k // 2) or packed.dtype != torch.uint8:
            raise ValueError(
                f"{what}: weight_packed must be uint8 of shape ({n}, {k // 2}), "
                f"got {packed.dtype} {tuple(packed.shape)}"
            )
        global_scale = 1.0
        if layout.kind == "nvfp4":
            g = t["weight_global_scale"].reshape(-1)
            if g.numel() != 1:
                raise ValueError(
                    f"{what}: weight_global_scale must hold one value, got "
                    f"{tuple(t['weight_global_scale'].shape)}"
                )
            global_scale = float(g.float())
            scales = scales.view(torch.uint8) if scales.dtype == torch.float8_e4m3fn else scales
    if tuple(scales.shape) != (n, k // group) or scales.dtype != torch.uint8:
        encoding = "e4m3" if layout.kind == "nvfp4" else "uint8 e8m0"
        raise ValueError(
            f"{what}: the scales must be {encoding} of shape ({n}, {k // group}), "
            f"got {scales.dtype} {tuple(scales.shape)}"
        )
    return _codes_of_bytes(packed), scales, global_scale
