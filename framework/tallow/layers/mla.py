"""Multi-head latent attention (MLA, DeepSeek-V2/V3): the layer model plugins call.

The model computes, per token, the queries ``q`` [T, H * (Dn + Dr)] (``Dn`` =
``qk_nope_head_dim``, ``Dr`` = ``qk_rope_head_dim``; the rope part already rotated) and the
latent row ``[c, k_pe]`` [T, R + Dr] (``c`` the compressed K/V after its RMSNorm, ``k_pe`` the
rotated shared key part). :class:`MLAAttention` caches the latent rows in a paged latent cache
(:class:`~tallow.layers.LatentCacheSpec`, one row of ``R + Dr`` per token for all heads, in the
KV codec's :meth:`~tallow.plugin.KVCodec.latent_dtype`) and runs the attention through the
step's backend (:meth:`tallow.plugin.AttentionBackend.forward_mla`), with the up-projection of
``kv_b_proj`` split per head into ``w_uk`` [H, Dn, R] and ``w_uv`` [H, Dv, R].

The up-projections are taken from the model's ``kv_b_proj`` once its weights are loaded
(:meth:`MLAAttention.absorb`): the projection is applied to the identity, so any linear method
(float, fp8 blocks, ...) gives its dense weight.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.types import MLALayer

from .attention import get_forward_context
from .cache_spec import CacheSpec, LatentCacheSpec

__all__ = ["MLAAttention", "MLALayer"]


class MLAAttention(nn.Module):
    """Latent attention of one layer: ``forward(q [T, H*(Dn+Dr)], latent [T, R+Dr]) ->
    [T, H*Dv]``. ``num_heads`` are this tensor-parallel rank's heads (the latent is the same
    on every rank); ``scale`` is the softmax scale of q.k (DeepSeek folds YaRN's mscale into
    it)."""

    #: the up-projections, per head (buffers filled by :meth:`absorb`)
    w_uk: torch.Tensor
    w_uv: torch.Tensor

    def __init__(
        self,
        layer_index: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        scale: float,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("num_heads", num_heads),
            ("kv_lora_rank", kv_lora_rank),
            ("qk_rope_head_dim", qk_rope_head_dim),
            ("v_head_dim", v_head_dim),
        ):
            if int(value) < 1:
                raise ValueError(f"MLAAttention: {name} must be positive, got {value!r}")
        if qk_nope_head_dim < 0:
            raise ValueError(
                f"MLAAttention: qk_nope_head_dim must be >= 0, got {qk_nope_head_dim!r}"
            )
        self.layer = MLALayer(
            layer_index=int(layer_index),
            num_heads=int(num_heads),
            kv_lora_rank=int(kv_lora_rank),
            qk_nope_head_dim=int(qk_nope_head_dim),
            qk_rope_head_dim=int(qk_rope_head_dim),
            v_head_dim=int(v_head_dim),
            scale=float(scale),
        )
        spec = self.layer
        # filled by absorb(); buffers so that they follow the model's device
        self.register_buffer(
            "w_uk",
            torch.zeros(
                spec.num_heads, spec.qk_nope_head_dim, spec.kv_lora_rank, device=device, dtype=dtype
            ),
            persistent=False,
        )
        self.register_buffer(
            "w_uv",
            torch.zeros(
                spec.num_heads, spec.v_head_dim, spec.kv_lora_rank, device=device, dtype=dtype
            ),
            persistent=False,
        )
        self.absorbed = False
        self.cache: torch.Tensor | None = None
        #: the paged cache group whose block tables this layer reads (set by bind_cache)
        self.cache_group = 0

    # -- the cache ---------------------------------------------------------------------------
    def cache_spec(self) -> CacheSpec:
        """One latent row of ``kv_lora_rank + qk_rope_head_dim`` per token (dtype: the KV
        codec's latent dtype)."""
        return LatentCacheSpec(width=self.layer.latent_width)

    def bind_cache(self, cache: Any, group: int) -> None:  # Any: the latent tensor
        if (
            not isinstance(cache, torch.Tensor)
            or cache.dim() != 3
            or cache.shape[-1] != self.layer.latent_width
        ):
            raise ValueError(
                f"MLA layer {self.layer.layer_index}: the latent cache must be a "
                f"tensor [blocks, block_size, {self.layer.latent_width}], got "
                f"{getattr(cache, 'shape', type(cache).__name__)}"
            )
        self.cache = cache
        self.cache_group = group

    # -- weights -----------------------------------------------------------------------------
    def set_up_projection(self, weight: torch.Tensor) -> None:
        """Take ``kv_b_proj``'s dense weight [H * (Dn + Dv), R] (this rank's heads, each
        head's Dn key rows then its Dv value rows, as DeepSeek checkpoints lay it out)."""
        s = self.layer
        expected = (s.num_heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank)
        if tuple(weight.shape) != expected:
            raise ValueError(
                f"MLA layer {s.layer_index}: kv_b_proj weight must be "
                f"{list(expected)}, got {list(weight.shape)}"
            )
        per_head = weight.view(s.num_heads, s.qk_nope_head_dim + s.v_head_dim, s.kv_lora_rank)
        with torch.no_grad():
            self.w_uk.copy_(per_head[:, : s.qk_nope_head_dim])
            self.w_uv.copy_(per_head[:, s.qk_nope_head_dim :])
        self.absorbed = True

    @torch.no_grad()
    def absorb(self, kv_b_proj: nn.Module) -> None:
        """Take the up-projection from the loaded ``kv_b_proj`` module (any linear method):
        its output for the identity is its weight, transposed."""
        eye = torch.eye(self.layer.kv_lora_rank, device=self.w_uk.device, dtype=self.w_uk.dtype)
        out = kv_b_proj(eye)
        out = out[0] if isinstance(out, tuple) else out
        self.set_up_projection(out.t().contiguous())

    # -- running -----------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        s = self.layer
        if self.cache is None:
            raise RuntimeError(f"MLA layer {s.layer_index} has no latent cache bound")
        if not self.absorbed:
            raise RuntimeError(
                f"MLA layer {s.layer_index}: its up-projection was never set "
                "(call absorb(kv_b_proj) after loading the weights)"
            )
        if not getattr(ctx.backend, "supports_mla", False):
            raise RuntimeError(
                f"attention backend {getattr(ctx.backend, 'name', '?')!r} has no "
                "latent attention (MLA) path"
            )
        n = q.shape[0]
        q = q.view(n, s.num_heads, s.qk_nope_head_dim + s.qk_rope_head_dim)
        q_nope, q_pe = q.split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)
        out = ctx.backend.forward_mla(
            s,
            q_nope,
            q_pe,
            latent,
            self.cache,
            self.w_uk,
            self.w_uv,
            ctx.meta.group(self.cache_group),
        )
        return out.reshape(n, s.num_heads * s.v_head_dim)

    def extra_repr(self) -> str:
        s = self.layer
        return (
            f"layer={s.layer_index}, heads={s.num_heads}, kv_lora_rank={s.kv_lora_rank}, "
            f"nope={s.qk_nope_head_dim}, rope={s.qk_rope_head_dim}, v={s.v_head_dim}"
        )
