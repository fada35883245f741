"""Gemma 3's vision side: the SigLIP vision tower and the multi-modal projector.

* patch embedding: the checkpoint's Conv2d over ``patch × patch`` pixels with an equal stride
  is a linear map of each flattened patch (``[C * P * P]``), done as one;
* a learned position embedding per patch (``(image_size / patch_size)²`` of them);
* encoder layers: LayerNorm, attention over the whole image (biased q/k/v/out projections,
  ``head_dim ** -0.5``), residual; LayerNorm, ``fc2(act(fc1(x)))``, residual;
* ``post_layernorm``;
* the projector: the patch grid average-pooled to ``mm_tokens_per_image`` tokens (a square),
  Gemma's RMSNorm (``1 + weight``), and a matrix product with ``mm_input_projection_weight``
  ``[vision hidden, text hidden]`` into the text model's width.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from tallow.layers import BuildContext, LayerNorm, RMSNorm, ReplicatedLinear, get_act


def _require(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ValueError(f"model config: vision_config.{key} is required")
    return value


class SiglipAttention(nn.Module):
    def __init__(self, dim: int, heads: int, build: BuildContext, prefix: str) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(
                f"model config: vision_config.hidden_size {dim} is not a multiple "
                f"of num_attention_heads {heads}"
            )
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            ReplicatedLinear(dim, dim, True, build=build, prefix=f"{prefix}.{name}")
            for name in ("q_proj", "k_proj", "v_proj", "out_proj")
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(n, self.heads, self.head_dim).transpose(0, 1)

        out = F.scaled_dot_product_attention(
            heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        )
        return self.out_proj(out.transpose(0, 1).reshape(n, -1))


class SiglipLayer(nn.Module):
    def __init__(
        self,
        dim: int,
        heads: int,
        hidden: int,
        act: str,
        eps: float,
        build: BuildContext,
        prefix: str,
    ) -> None:
        super().__init__()
        self.layer_norm1 = LayerNorm(dim, eps, build=build)
        self.self_attn = SiglipAttention(dim, heads, build, f"{prefix}.self_attn")
        self.layer_norm2 = LayerNorm(dim, eps, build=build)
        self.fc1 = ReplicatedLinear(dim, hidden, True, build=build, prefix=f"{prefix}.mlp.fc1")
        self.fc2 = ReplicatedLinear(hidden, dim, True, build=build, prefix=f"{prefix}.mlp.fc2")
        self.act = get_act(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.fc2(self.act(self.fc1(self.layer_norm2(x))))


class Gemma3VisionTower(nn.Module):
    """``forward(pixel_values [C, H, W]) -> [mm_tokens_per_image, text hidden]``."""

    def __init__(
        self,
        vision: Mapping[str, Any],
        text_hidden: int,
        tokens_per_image: int,
        build: BuildContext,
    ) -> None:
        super().__init__()
        dim = int(_require(vision, "hidden_size"))
        self.patch = int(_require(vision, "patch_size"))
        self.image_size = int(_require(vision, "image_size"))
        self.channels = int(vision.get("num_channels") or 3)
        if self.image_size % self.patch:
            raise ValueError(
                f"model config: vision_config.image_size {self.image_size} is not a "
                f"multiple of patch_size {self.patch}"
            )
        self.side = self.image_size // self.patch
        per_side = math.isqrt(tokens_per_image)
        if per_side * per_side != tokens_per_image or self.side % per_side:
            raise ValueError(
                f"model config: mm_tokens_per_image {tokens_per_image} must be a "
                f"square whose side divides the {self.side} patches per side"
            )
        self.pool = self.side // per_side
        eps = float(vision.get("layer_norm_eps") or 1e-6)
        act = str(vision.get("hidden_act") or "gelu_pytorch_tanh")
        heads = int(_require(vision, "num_attention_heads"))
        hidden = int(_require(vision, "intermediate_size"))
        layers = int(_require(vision, "num_hidden_layers"))
        self.patch_embedding = ReplicatedLinear(
            self.channels * self.patch * self.patch,
            dim,
            True,
            build=build,
            prefix="vision_tower.patch_embedding",
        )
        self.position_embedding = nn.Parameter(
            torch.empty(self.side * self.side, dim, dtype=build.dtype, device=build.device),
            requires_grad=False,
        )
        self.layers = nn.ModuleList(
            SiglipLayer(dim, heads, hidden, act, eps, build, f"vision_tower.layers.{i}")
            for i in range(layers)
        )
        self.post_layernorm = LayerNorm(dim, eps, build=build)
        self.soft_emb_norm = RMSNorm(dim, eps, offset=True, build=build)
        self.projection = nn.Parameter(
            torch.empty(dim, text_hidden, dtype=build.dtype, device=build.device),
            requires_grad=False,
        )

    def patches(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[C, H, W]`` → ``[side², C * P * P]`` in row-major patch order."""
        c, p, s = self.channels, self.patch, self.side
        if tuple(pixels.shape) != (c, self.image_size, self.image_size):
            raise ValueError(
                f"pixel_values: expected shape ({c}, {self.image_size}, "
                f"{self.image_size}), got {tuple(pixels.shape)}"
            )
        x = pixels.reshape(c, s, p, s, p).permute(1, 3, 0, 2, 4)
        return x.reshape(s * s, c * p * p)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        dtype = self.position_embedding.dtype
        x = self.patch_embedding(self.patches(pixels.to(self.position_embedding.device, dtype)))
        x = x + self.position_embedding
        for layer in self.layers:
            x = layer(x)
        x = self.post_layernorm(x)
        # [side², dim] → [dim, side, side], pooled to tokens_per_side², back to rows
        grid = x.transpose(0, 1).reshape(1, -1, self.side, self.side)
        pooled = F.avg_pool2d(grid, self.pool, self.pool).flatten(2)[0].transpose(0, 1)
        return torch.matmul(self.soft_emb_norm(pooled), self.projection)
