"""The Qwen3-VL vision tower: patches of one image → embeddings in the text model's width, and
its DeepStack features.

What it shares with the Qwen2-VL towers (:mod:`tallow_model_qwen2_vl.vision`): the patch
embedding as one linear map (biased here), the 2-D rotary embedding of each head, the
attention block, full attention within each frame. What differs:

* a learned ``num_position_embeddings`` table (a square ``side × side`` grid) added to the
  patch embeddings, resampled to the image's ``h × w`` patch grid by bilinear interpolation
  with aligned corners (:func:`interpolation_taps`);
* LayerNorms and a two-layer ``hidden_act`` MLP (``linear_fc1``, ``linear_fc2``) in every block;
* the patch merger: LayerNorm over each patch, the ``spatial_merge_size²`` neighbours
  concatenated, ``linear_fc1``, GELU, ``linear_fc2``;
* DeepStack: after each block listed in ``deepstack_visual_indexes`` a merger of its own (its
  LayerNorm over the concatenated neighbours) turns the block's output into features that the
  text model adds to the image tokens' hidden states after its first decoder layers.

The tower returns ``[tokens, out * (1 + len(deepstack_visual_indexes))]``: the merged
embeddings, then each DeepStack feature, side by side, so that one tensor per image travels
through the engine's encoder cache.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from tallow.layers import BuildContext, LayerNorm, ReplicatedLinear

from .vision import (
    PlainVisionMLP,
    VisionAttention,
    VisionBlock,
    VisionRotary,
    _block_mask,
    _require,
    rotary_positions,
)


def interpolation_taps(
    rows: torch.Tensor, cols: torch.Tensor, grid_h: int, grid_w: int, side: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices ``[n, 4]`` into a flattened ``side × side`` table, weights ``[n, 4]``) that
    resample the table bilinearly (corners aligned) at patch ``(rows, cols)`` of an
    ``grid_h × grid_w`` grid."""

    def axis(index: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        # corners aligned: patch 0 samples entry 0, patch size - 1 samples entry side - 1
        src = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
        floor = torch.floor(src)
        taps = (floor.long()[:, None] + torch.arange(2)).clamp(0, side - 1)
        distance = (src[:, None] - floor[:, None] - torch.arange(2)).abs()
        return taps, (1 - distance).clamp(min=0)

    h_taps, h_weights = axis(rows, grid_h)
    w_taps, w_weights = axis(cols, grid_w)
    indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
    return indices, weights


class Qwen3PatchMerger(nn.Module):
    """LayerNorm (before or after concatenating the neighbours), ``linear_fc1``, GELU,
    ``linear_fc2``."""

    def __init__(
        self, dim: int, out: int, merge: int, postshuffle: bool, build: BuildContext, prefix: str
    ) -> None:
        super().__init__()
        self.width = dim * merge * merge
        self.postshuffle = postshuffle
        self.norm = LayerNorm(self.width if postshuffle else dim, 1e-6, build=build)
        self.linear_fc1 = ReplicatedLinear(
            self.width, self.width, True, build=build, prefix=f"{prefix}.linear_fc1"
        )
        self.linear_fc2 = ReplicatedLinear(
            self.width, out, True, build=build, prefix=f"{prefix}.linear_fc2"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (
            self.norm(x.reshape(-1, self.width))
            if self.postshuffle
            else self.norm(x).reshape(-1, self.width)
        )
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class Qwen3VisionTower(nn.Module):
    """``forward(pixel_values [patches, C*T*P*P], grid (t, h, w))
    -> [patches / m², out * (1 + deepstack)]`` (see the module docstring)."""

    #: config keys of the tower's width and of its output width
    width_key, out_key = "hidden_size", "out_hidden_size"

    def __init__(self, config: Mapping[str, Any], build: BuildContext) -> None:
        super().__init__()
        dim = int(_require(config, "hidden_size"))
        heads = int(_require(config, "num_heads"))
        depth = int(_require(config, "depth"))
        out = int(_require(config, "out_hidden_size"))
        self.patch = int(config.get("patch_size", 16))
        self.temporal = int(config.get("temporal_patch_size", 2))
        self.channels = int(config.get("in_channels", 3))
        self.merge = int(config.get("spatial_merge_size", 2))
        positions = int(_require(config, "num_position_embeddings"))
        self.side = int(positions**0.5)
        if self.side * self.side != positions:
            raise ValueError(
                f"model config: vision_config.num_position_embeddings {positions} is not a square"
            )
        self.deepstack = [int(i) for i in config.get("deepstack_visual_indexes") or ()]
        bad = [i for i in self.deepstack if not 0 <= i < depth]
        if bad:
            raise ValueError(
                f"model config: vision_config.deepstack_visual_indexes {bad} are "
                f"not blocks of a tower of depth {depth}"
            )
        rope = config.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", 10000.0)) if isinstance(rope, Mapping) else 10000.0
        patch_width = self.channels * self.temporal * self.patch * self.patch
        self.patch_embed = ReplicatedLinear(
            patch_width, dim, True, build=build, prefix="visual.patch_embed"
        )
        self.pos_embed = nn.Parameter(
            torch.empty(positions, dim, device=build.device, dtype=build.dtype), requires_grad=False
        )
        self.rotary = VisionRotary(dim // heads, theta)
        act = str(config.get("hidden_act", "gelu_pytorch_tanh"))
        hidden = int(_require(config, "intermediate_size"))
        self.blocks = nn.ModuleList(
            VisionBlock(
                (LayerNorm(dim, 1e-6, build=build), LayerNorm(dim, 1e-6, build=build)),
                VisionAttention(dim, heads, build, f"visual.blocks.{i}.attn"),
                PlainVisionMLP(dim, hidden, act, build, f"visual.blocks.{i}.mlp"),
            )
            for i in range(depth)
        )
        self.merger = Qwen3PatchMerger(dim, out, self.merge, False, build, "visual.merger")
        self.deepstack_merger_list = nn.ModuleList(
            Qwen3PatchMerger(dim, out, self.merge, True, build, f"visual.deepstack_merger_list.{j}")
            for j in range(len(self.deepstack))
        )

    def position_embeddings(self, grid_h: int, grid_w: int) -> torch.Tensor:
        """The learned table resampled to an ``h × w`` grid, ``[h * w, dim]`` in the
        processor's patch order."""
        rc = rotary_positions(grid_h, grid_w, self.merge)
        indices, weights = interpolation_taps(rc[:, 0], rc[:, 1], grid_h, grid_w, self.side)
        table = self.pos_embed
        weights = weights.to(table.device)
        return (table[indices.to(table.device)] * weights[:, :, None]).sum(1)

    def forward(self, pixel_values: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        t, h, w = grid
        if pixel_values.shape[0] != t * h * w:
            raise ValueError(
                f"pixel_values has {pixel_values.shape[0]} patches for a grid of {t}x{h}x{w}"
            )
        table = self.pos_embed  # the tower's device and dtype
        x = self.patch_embed(pixel_values.to(table.device, table.dtype))
        x = x + self.position_embeddings(h, w).repeat(t, 1).to(x.dtype)
        cos, sin = self.rotary(rotary_positions(h, w, self.merge).repeat(t, 1))
        cos, sin = cos.to(x.device), sin.to(x.device)
        frame_mask = _block_mask([h * w] * t, x.device)
        features = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frame_mask)
            if i in self.deepstack:
                features.append(self.deepstack_merger_list[self.deepstack.index(i)](x))
        return torch.cat([self.merger(x)] + features, dim=-1)
