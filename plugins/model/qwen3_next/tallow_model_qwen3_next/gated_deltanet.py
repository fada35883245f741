"""Qwen3-Next's linear-attention token mixer (Gated DeltaNet) on the engine's state slots.

For a token ``x`` of hidden size ``H``:

1. ``in_proj_qkvz(x)`` gives q, k (``Hk`` heads of ``Dk``), v and z (``Hv`` heads of ``Dv``);
   ``in_proj_ba(x)`` gives ``b`` and ``a`` (``Hv`` each). A Qwen3-Next checkpoint interleaves
   them per key head (``[q_h, k_h, v_h.., z_h..]`` and ``[b_h.., a_h..]``); loading reorders
   the rows into ``[q | k | v | z]`` and ``[b | a]`` so that the convolution's input ``[q | k
   | v]`` is one slice of the projection. A Qwen3.5 checkpoint stores ``in_proj_qkv``,
   ``in_proj_z``, ``in_proj_b`` and ``in_proj_a`` apart, already in that order (shards 0 and 1
   of the two projections).
2. A causal depthwise convolution of ``linear_conv_kernel_dim`` taps with SiLU over ``[q | k
   | v]`` (:func:`tallow.kernels.causal_conv1d`), its last inputs kept in the state.
3. The gated delta rule (:mod:`tallow.kernels.gated_delta`) with ``g = -exp(A_log) *
   softplus(a + dt_bias)``, ``beta = sigmoid(b)``, q and k L2-normalised, its ``[Hv, Dk,
   Dv]`` float32 state kept per sequence.
4. A gated RMSNorm over each value head, ``weight * norm(o) * silu(z)``, and ``out_proj``.

The layer declares a :class:`tallow.layers.RecurrentStateSpec` (``conv``: ``[K - 1, Dconv]``
in the model's dtype, ``ssm``: ``[Hv, Dk, Dv]`` float32): the engine gives each sequence one
state slot for all such layers. Decode-only steps (one token per sequence, CUDA graphs) take
the one-token kernels; other steps the prefill kernels over the step's flat sequences.
"""

from __future__ import annotations

import torch
from torch import nn

from tallow.kernels import (
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    gated_delta_step,
    gated_rms_norm,
    gdn_gating,
)
from tallow.layers import (
    ArchConfig,
    BuildContext,
    MergedColumnParallelLinear,
    RecurrentStateSpec,
    ReplicatedLinear,
    StateCache,
    StateTensorSpec,
    get_forward_context,
)


def _param(shape: tuple[int, ...], build: BuildContext, fill: float = 0.0) -> nn.Parameter:
    return nn.Parameter(
        torch.full(shape, fill, dtype=build.dtype, device=build.device), requires_grad=False
    )


class GatedRMSNorm(nn.Module):
    """``weight * rmsnorm(x) * silu(gate)`` over the last dimension
    (:func:`tallow.kernels.gated_rms_norm`: transformers' Qwen3NextRMSNormGated, one launch on
    a GPU)."""

    def __init__(self, size: int, eps: float, build: BuildContext) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param((size,), build, 1.0)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)


class _ConvTaps(nn.Module):
    """The depthwise convolution's taps ``[channels, K]`` (checkpoint ``conv1d.weight``)."""

    def __init__(self, channels: int, taps: int, build: BuildContext) -> None:
        super().__init__()
        self.weight = _param((channels, taps), build)


class GatedDeltaNet(nn.Module):
    """One linear-attention layer (see the module docstring): ``forward(x [T, H]) -> [T, H]``.

    Tensor parallelism is not offered: the engine refuses it for models with a recurrent
    state."""

    def __init__(self, config: ArchConfig, build: BuildContext, prefix: str) -> None:
        super().__init__()
        if build.tp_size > 1:
            raise ValueError("the Gated DeltaNet layers do not run under tensor parallelism")
        hidden = int(config.hidden_size)
        self.num_k_heads = int(config.require("linear_num_key_heads"))
        self.num_v_heads = int(config.require("linear_num_value_heads"))
        self.head_k_dim = int(config.require("linear_key_head_dim"))
        self.head_v_dim = int(config.require("linear_value_head_dim"))
        self.conv_taps = int(config.get("linear_conv_kernel_dim", 4))
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"model config: linear_num_value_heads {self.num_v_heads} must be "
                f"a multiple of linear_num_key_heads {self.num_k_heads}"
            )
        if self.conv_taps < 2:
            raise ValueError(
                f"model config: linear_conv_kernel_dim must be at least 2, got {self.conv_taps}"
            )
        act = config.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(
                f"model config: hidden_act {act!r} is not supported by the "
                "linear-attention convolution (SiLU)"
            )
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.in_proj_qkvz = MergedColumnParallelLinear(
            hidden, [self.conv_dim, self.value_dim], build=build, prefix=f"{prefix}.in_proj_qkvz"
        )
        self.in_proj_ba = MergedColumnParallelLinear(
            hidden, [self.num_v_heads] * 2, build=build, prefix=f"{prefix}.in_proj_ba"
        )
        self.conv1d = _ConvTaps(self.conv_dim, self.conv_taps, build)
        self.dt_bias = _param((self.num_v_heads,), build, 1.0)
        self.A_log = _param((self.num_v_heads,), build)
        self.norm = GatedRMSNorm(self.head_v_dim, float(config.get("rms_norm_eps", 1e-6)), build)
        self.out_proj = ReplicatedLinear(
            self.value_dim, hidden, build=build, prefix=f"{prefix}.out_proj"
        )
        self.cache: StateCache | None = None

    # -- the state ----------------------------------------------------------------------------
    def cache_spec(self) -> RecurrentStateSpec:
        return RecurrentStateSpec(
            (
                StateTensorSpec("conv", (self.conv_taps - 1, self.conv_dim)),
                StateTensorSpec(
                    "ssm", (self.num_v_heads, self.head_k_dim, self.head_v_dim), torch.float32
                ),
            )
        )

    def bind_cache(self, cache: StateCache, group: int) -> None:
        self.cache = cache

    # -- checkpoint layout --------------------------------------------------------------------
    def qkvz_rows(self, w: torch.Tensor) -> torch.Tensor:
        """The checkpoint's per-key-head ``[q_h, k_h, v_h.., z_h..]`` rows as ``[q | k | v |
        z]``."""
        r = self.num_v_heads // self.num_k_heads
        sizes = [self.head_k_dim, self.head_k_dim, r * self.head_v_dim, r * self.head_v_dim]
        if w.shape[0] != self.num_k_heads * sum(sizes):
            raise ValueError(
                f"in_proj_qkvz: expected {self.num_k_heads * sum(sizes)} rows, got {w.shape[0]}"
            )
        parts = w.reshape(self.num_k_heads, sum(sizes), *w.shape[1:]).split(sizes, dim=1)
        return torch.cat([p.reshape(-1, *w.shape[1:]) for p in parts])

    def ba_rows(self, w: torch.Tensor) -> torch.Tensor:
        """The checkpoint's per-key-head ``[b_h.., a_h..]`` rows as ``[b | a]``."""
        r = self.num_v_heads // self.num_k_heads
        if w.shape[0] != 2 * self.num_v_heads:
            raise ValueError(f"in_proj_ba: expected {2 * self.num_v_heads} rows, got {w.shape[0]}")
        b, a = w.reshape(self.num_k_heads, 2 * r, *w.shape[1:]).split([r, r], dim=1)
        return torch.cat([b.reshape(-1, *w.shape[1:]), a.reshape(-1, *w.shape[1:])])

    def scale_rows(self, scale: torch.Tensor, rows: int, what: str, reorder) -> torch.Tensor:
        """An fp8 weight scale of a ``[rows, ...]`` projection whose rows ``reorder`` moves
        (:meth:`qkvz_rows`, :meth:`ba_rows`): one value as it is, one per row reordered, one
        per block of rows reordered by whole blocks (refused when a block would mix rows of
        different blocks)."""
        if scale.numel() == 1:
            return scale
        if scale.shape[0] == rows:
            return reorder(scale)
        block = -(-rows // scale.shape[0])
        if -(-rows // block) != scale.shape[0]:
            raise ValueError(
                f"{what}: a weight scale of {scale.shape[0]} rows fits neither the "
                f"projection's {rows} rows nor blocks of them"
            )
        # every row's scale, moved with the rows, must again be constant over each block
        per_row = reorder(scale.repeat_interleave(block, 0)[:rows])
        padded = torch.cat([per_row, per_row[-1:].expand(-(-rows // block) * block - rows, -1)])
        blocks = padded.reshape(-1, block, *scale.shape[1:])
        if not bool((blocks == blocks[:, :1]).all()):
            raise ValueError(
                f"{what}: block-wise weight scales ({block} rows a block) cannot follow the "
                "per-key-head reordering of the rows: a head's parts are not whole blocks"
            )
        return blocks[:, 0].contiguous()

    # -- running ------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        if cache is None:
            raise RuntimeError("the linear-attention layer has no state cache bound")
        meta = get_forward_context().meta
        slots = meta.state_slots[cache.group]
        t = x.shape[0]
        proj = self.in_proj_qkvz(x)
        mixed, z = proj[:, : self.conv_dim], proj[:, self.conv_dim :]
        b, a = self.in_proj_ba(x).split(self.num_v_heads, dim=-1)
        weight = self.conv1d.weight
        if meta.is_decode_only:
            # one row per sequence (a CUDA graph's padding rows name the dummy slot)
            mixed = causal_conv1d_update(mixed, weight, None, cache["conv"], slots)
        else:
            mixed = causal_conv1d(
                mixed,
                weight,
                None,
                cache["conv"],
                slots,
                meta.query_start_loc,
                max_query_len=meta.max_query_len,
                query_start_loc_cpu=meta.query_start_loc_cpu,
            )
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(t, self.num_k_heads, self.head_k_dim)
        k = k.reshape(t, self.num_k_heads, self.head_k_dim)
        v = v.reshape(t, self.num_v_heads, self.head_v_dim)
        if meta.is_decode_only:
            out = gated_delta_step(q, k, v, a, b, self.A_log, self.dt_bias, cache["ssm"], slots)
        else:
            g, beta = gdn_gating(a, b, self.A_log, self.dt_bias)
            out = chunk_gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                cache["ssm"],
                slots,
                meta.query_start_loc,
                max_query_len=meta.max_query_len,
                query_start_loc_cpu=meta.query_start_loc_cpu,
            )
        out = self.norm(out, z.reshape(t, self.num_v_heads, self.head_v_dim))
        return self.out_proj(out.reshape(t, self.value_dim))
