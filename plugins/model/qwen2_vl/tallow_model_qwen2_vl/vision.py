"""The Qwen2.5-VL and Qwen2-VL vision towers: patches of one image → embeddings in the text
model's width.

* patch embedding: the checkpoint's Conv3d over ``(temporal_patch, patch, patch)`` with an
  equal stride is a linear map of each flattened patch (``[C * T * P * P]``), done as one;
* blocks: RMSNorm, attention with a 2-D rotary embedding (height and width halves of each
  head), RMSNorm, SwiGLU MLP (biased). Most blocks attend within windows of
  ``window_size`` pixels; those in ``fullatt_block_indexes`` attend over the whole image;
* the patch merger: RMSNorm, the ``spatial_merge_size²`` neighbouring patches concatenated,
  a two-layer GELU MLP to ``out_hidden_size``.

Patches come in the processor's order (each ``merge × merge`` group of neighbours
contiguous); for window attention they are permuted so that each window is contiguous and
the merger's output is permuted back.

Qwen2-VL (:class:`Qwen2VisionTower`) differs only in its parts: LayerNorms, a two-layer MLP
(``fc1``, ``hidden_act``, ``fc2``; ``mlp_ratio`` wide), full attention in every block, and its
widths named ``embed_dim`` (the tower) and ``hidden_size`` (the output).
"""

from __future__ import annotations

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


def rotary_positions(grid_h: int, grid_w: int, merge: int) -> torch.Tensor:
    """``[h * w, 2]`` (row, column) of each patch in the processor's order (merge groups)."""
    rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    shape = (grid_h // merge, merge, grid_w // merge, merge)
    rows = rows.reshape(shape).transpose(1, 2).flatten()
    cols = cols.reshape(shape).transpose(1, 2).flatten()
    return torch.stack([rows, cols], dim=-1)


def window_order(
    grid_t: int, grid_h: int, grid_w: int, merge: int, window: int
) -> tuple[torch.Tensor, list[int]]:
    """(the merge groups in window order ``[t * h/m * w/m]``, the patch count of each window).

    ``window`` is the window's side in merged patches; windows at the right and bottom edges
    are cut short."""
    gh, gw = grid_h // merge, grid_w // merge
    index = torch.arange(grid_t * gh * gw).reshape(grid_t, gh, gw)
    pad_h, pad_w = (-gh) % window, (-gw) % window
    padded = F.pad(index, (0, pad_w, 0, pad_h), value=-1)
    nh, nw = (gh + pad_h) // window, (gw + pad_w) // window
    padded = padded.reshape(grid_t, nh, window, nw, window).permute(0, 1, 3, 2, 4)
    padded = padded.reshape(grid_t, nh * nw, window * window)
    counts = (padded >= 0).sum(-1).flatten()
    flat = padded.flatten()
    order = flat[flat >= 0]
    unit = merge * merge
    return order, [int(c) * unit for c in counts if int(c) > 0]


class VisionRotary(nn.Module):
    """cos and sin ``[patches, head_dim]`` of the 2-D rotary embedding: the first half of the
    frequencies turns with the row, the second with the column, both halves repeated."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        quarter = head_dim // 2
        inv = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float32) / quarter))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(self.inv_freq.device, torch.float32)[..., None] * self.inv_freq
        freqs = freqs.flatten(1)  # [n, row freqs | column freqs]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of ``x [n, heads, D]`` in float32 (as the reference does)."""
    dtype = x.dtype
    x = x.float()
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos[:, None] + rotated * sin[:, None]).to(dtype)


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int, build: BuildContext, prefix: str) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(
                f"model config: vision_config.hidden_size {dim} is not a multiple "
                f"of num_heads {heads}"
            )
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = ReplicatedLinear(dim, 3 * dim, True, build=build, prefix=f"{prefix}.qkv")
        self.proj = ReplicatedLinear(dim, dim, True, build=build, prefix=f"{prefix}.proj")

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.heads, self.head_dim).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # [heads, n, D]; ``mask`` keeps attention inside each window (None: whole image)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
        )
        return self.proj(out.transpose(0, 1).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, build: BuildContext, prefix: str) -> None:
        super().__init__()
        self.gate_proj = ReplicatedLinear(
            dim, hidden, True, build=build, prefix=f"{prefix}.gate_proj"
        )
        self.up_proj = ReplicatedLinear(dim, hidden, True, build=build, prefix=f"{prefix}.up_proj")
        self.down_proj = ReplicatedLinear(
            hidden, dim, True, build=build, prefix=f"{prefix}.down_proj"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class PlainVisionMLP(nn.Module):
    """Qwen2-VL's ``fc2(act(fc1(x)))``."""

    def __init__(self, dim: int, hidden: int, act: str, build: BuildContext, prefix: str) -> None:
        super().__init__()
        self.fc1 = ReplicatedLinear(dim, hidden, True, build=build, prefix=f"{prefix}.fc1")
        self.fc2 = ReplicatedLinear(hidden, dim, True, build=build, prefix=f"{prefix}.fc2")
        self.act = get_act(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionBlock(nn.Module):
    def __init__(
        self, norms: tuple[nn.Module, nn.Module], attn: VisionAttention, mlp: nn.Module
    ) -> None:
        super().__init__()
        self.norm1, self.norm2 = norms
        self.attn = attn
        self.mlp = mlp

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(
        self, dim: int, context: int, merge: int, norm: nn.Module, build: BuildContext, prefix: str
    ) -> None:
        super().__init__()
        self.width = context * merge * merge
        self.ln_q = norm
        self.fc1 = ReplicatedLinear(
            self.width, self.width, True, build=build, prefix=f"{prefix}.mlp.0"
        )
        self.fc2 = ReplicatedLinear(self.width, dim, True, build=build, prefix=f"{prefix}.mlp.2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.ln_q(x).reshape(-1, self.width))))


class Qwen2_5_VisionTower(nn.Module):
    """``forward(pixel_values [patches, C*T*P*P], grid (t, h, w)) -> [patches / m², out]``."""

    #: config keys of the tower's width and of its output width
    width_key, out_key = "hidden_size", "out_hidden_size"

    def __init__(self, config: Mapping[str, Any], build: BuildContext) -> None:
        super().__init__()
        dim = int(_require(config, self.width_key))
        heads = int(_require(config, "num_heads"))
        depth = int(_require(config, "depth"))
        self.patch = int(config.get("patch_size", 14))
        self.temporal = int(config.get("temporal_patch_size", 2))
        self.channels = int(config.get("in_channels", config.get("in_chans", 3)))
        self.merge = int(config.get("spatial_merge_size", 2))
        self.full_attention = self.full_attention_blocks(config, depth)
        self.window = (
            int(config.get("window_size", 112)) // self.merge // self.patch
            if len(self.full_attention) < depth
            else 0
        )
        if len(self.full_attention) < depth and self.window < 1:
            raise ValueError(
                "model config: vision_config.window_size must be at least "
                "spatial_merge_size * patch_size"
            )
        rope = config.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", 10000.0)) if isinstance(rope, Mapping) else 10000.0
        patch_width = self.channels * self.temporal * self.patch * self.patch
        self.patch_embed = ReplicatedLinear(
            patch_width, dim, False, build=build, prefix="visual.patch_embed"
        )
        self.rotary = VisionRotary(dim // heads, theta)
        self.blocks = nn.ModuleList(
            VisionBlock(
                (self.norm(dim, build), self.norm(dim, build)),
                VisionAttention(dim, heads, build, f"visual.blocks.{i}.attn"),
                self.mlp(config, dim, build, f"visual.blocks.{i}.mlp"),
            )
            for i in range(depth)
        )
        self.merger = PatchMerger(
            int(_require(config, self.out_key)),
            dim,
            self.merge,
            self.norm(dim, build),
            build,
            "visual.merger",
        )

    # -- what the generations differ in -----------------------------------------------------
    def full_attention_blocks(self, config: Mapping[str, Any], depth: int) -> set[int]:
        return {int(i) for i in config.get("fullatt_block_indexes") or ()}

    def norm(self, dim: int, build: BuildContext) -> nn.Module:
        return RMSNorm(dim, 1e-6, build=build)

    def mlp(
        self, config: Mapping[str, Any], dim: int, build: BuildContext, prefix: str
    ) -> nn.Module:
        return VisionMLP(dim, int(_require(config, "intermediate_size")), build, prefix)

    def forward(self, pixel_values: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        t, h, w = grid
        unit = self.merge * self.merge
        if pixel_values.shape[0] != t * h * w:
            raise ValueError(
                f"pixel_values has {pixel_values.shape[0]} patches for a grid of {t}x{h}x{w}"
            )
        weight = self.patch_embed.weight
        x = self.patch_embed(pixel_values.to(weight.device, weight.dtype))
        if self.window:
            order, windows = window_order(t, h, w, self.merge, self.window)
        else:  # full attention everywhere: the processor's order, one window per frame
            order, windows = torch.arange(t * h * w // unit), [h * w] * t
        order = order.to(x.device)
        x = _in_windows(x, order, unit)
        cos, sin = self.rotary(rotary_positions(h, w, self.merge).repeat(t, 1))
        cos, sin = (
            _in_windows(cos.to(x.device), order, unit),
            _in_windows(sin.to(x.device), order, unit),
        )
        window_mask = _block_mask(windows, x.device)
        frame_mask = _block_mask([h * w] * t, x.device)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frame_mask if i in self.full_attention else window_mask)
        merged = self.merger(x)
        return merged[torch.argsort(order)]


def _in_windows(x: torch.Tensor, order: torch.Tensor, unit: int) -> torch.Tensor:
    """The rows of ``x`` with its groups of ``unit`` rows in ``order``."""
    return x.reshape(-1, unit, x.shape[-1])[order].reshape(x.shape)


def _block_mask(lengths: list[int], device: torch.device) -> torch.Tensor | None:
    """A boolean ``[n, n]`` mask that keeps attention within consecutive segments of
    ``lengths`` (None when there is one segment: attend to all)."""
    if len(lengths) == 1:
        return None
    ids = torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)
    )
    return ids[:, None] == ids[None, :]


class Qwen2VisionTower(Qwen2_5_VisionTower):
    """Qwen2-VL's tower (see the module docstring)."""

    width_key, out_key = "embed_dim", "hidden_size"

    def full_attention_blocks(self, config: Mapping[str, Any], depth: int) -> set[int]:
        return set(range(depth))

    def norm(self, dim: int, build: BuildContext) -> nn.Module:
        return LayerNorm(dim, 1e-6, build=build)

    def mlp(
        self, config: Mapping[str, Any], dim: int, build: BuildContext, prefix: str
    ) -> nn.Module:
        hidden = int(dim * float(config.get("mlp_ratio", 4)))
        return PlainVisionMLP(
            dim, hidden, str(config.get("hidden_act", "quick_gelu")), build, prefix
        )
