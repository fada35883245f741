"""Qwen2-MoE and Qwen3-MoE: Qwen attention and a mixture-of-experts MLP on a residual stream.

=========== =============== ========= =================== =====================================
model       q/k/v bias      q/k norm  router              shared expert
=========== =============== ========= =================== =====================================
Qwen2-MoE   ``qkv_bias``    no        softmax top-k,      ``shared_expert`` gated by
            (default on)              ``norm_topk_prob``  ``sigmoid(shared_expert_gate(x))``
Qwen3-MoE   ``attention_    per head  softmax top-k,      none
            bias``                    ``norm_topk_prob``
=========== =============== ========= =================== =====================================

Layer ``i`` has the MoE block when it is not in ``mlp_only_layers`` and ``(i + 1)`` is a
multiple of ``decoder_sparse_step``; the others have a dense SwiGLU MLP of
``intermediate_size``. The MoE block is :class:`tallow.layers.FusedMoE` (experts of
``moe_intermediate_size``). Checkpoint names: :mod:`tallow_model_qwen_moe.naming`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from tallow.layers import (
    ArchConfig, Attention, BuildContext, CausalLM, FusedMoE, LMHead,
    MergedColumnParallelLinear, QKVParallelLinear, RMSNorm, RotaryEmbedding, RouterSpec,
    RowParallelLinear, VocabEmbedding, get_act_and_mul, rope_from_config,
)

from .naming import hf_name_map


def num_experts(config: ArchConfig) -> int:
    """The routed experts of a config: ``num_experts`` (checkpoints) or ``num_local_experts``
    (what transformers 5 writes for Qwen3-MoE)."""
    value = config.get("num_experts") or config.get("num_local_experts")
    if not value:
        raise ValueError("model config: 'num_experts' (or 'num_local_experts') is required")
    return int(value)


def is_moe_layer(config: ArchConfig, layer: int) -> bool:
    """Whether decoder layer ``layer`` has the MoE block (transformers' rule)."""
    step = int(config.get("decoder_sparse_step") or 1)
    return (layer not in (config.get("mlp_only_layers") or [])
            and num_experts(config) > 0 and (layer + 1) % step == 0)


def layer_sliding_window(config: ArchConfig, layer: int) -> int | None:
    """``layer_types`` when given, else ``use_sliding_window`` from ``max_window_layers`` on;
    a window of 0 or None is no window."""
    window = config.get("sliding_window") or None
    types = config.get("layer_types")
    if types:
        return window if types[layer] == "sliding_attention" else None
    if not config.get("use_sliding_window", False) or window is None:
        return None
    return window if layer >= int(config.get("max_window_layers", 28)) else None


class DenseMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``, gate and up stored as one matrix (the layers of
    ``mlp_only_layers``)."""

    def __init__(self, hidden: int, intermediate: int, act: str, build: BuildContext,
                 prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2, build=build,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate, hidden, build=build,
                                           prefix=f"{prefix}.down_proj")
        self.act_fn = get_act_and_mul(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), act=self.act_fn)


class QwenMoeAttention(nn.Module):
    """qkv projection, optional per-head q/k RMSNorm (Qwen3), RoPE, paged attention, o_proj."""

    def __init__(self, config: ArchConfig, build: BuildContext, layer: int,
                 rotary: RotaryEmbedding, *, head_dim: int, qkv_bias: bool, qk_norm: bool,
                 prefix: str) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, heads, kv_heads, qkv_bias,
                                          build=build, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(heads * head_dim, hidden, False, build=build,
                                        prefix=f"{prefix}.o_proj")
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.q_norm = RMSNorm(head_dim, eps, build=build) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps, build=build) if qk_norm else None
        self.rotary_emb = rotary
        self.attn = Attention(layer, self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads,
                              head_dim, scale=head_dim ** -0.5,
                              sliding_window=layer_sliding_window(config, layer))

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        norms = (self.q_norm, self.k_norm) if self.q_norm is not None else None
        q, k = self.rotary_emb(positions, q, k, qk_norm=norms)
        return self.o_proj(self.attn(q, k, v))


class QwenMoeDecoderLayer(nn.Module):
    """Pre-norm attention and MLP (MoE or dense) blocks; the residual add is fused into the
    next norm."""

    def __init__(self, attn: nn.Module, mlp: nn.Module, hidden: int, eps: float,
                 build: BuildContext) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden, eps, build=build)
        self.post_attention_layernorm = RMSNorm(hidden, eps, build=build)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class QwenMoeModel(nn.Module):
    """Embedding, decoder layers, final norm."""

    def __init__(self, owner: "Qwen3MoeForCausalLM", config: ArchConfig,
                 build: BuildContext) -> None:
        super().__init__()
        hidden = int(config.require("hidden_size"))
        heads = int(config.require("num_attention_heads"))
        head_dim = int(config.get("head_dim") or hidden // heads)
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.rotary_emb = rope_from_config(config, head_dim, is_neox_style=True,
                                           device=build.device)
        self.embed_tokens = VocabEmbedding(int(config.require("vocab_size")), hidden,
                                           build=build, prefix="model.embed_tokens")
        layers = []
        for i in range(int(config.require("num_hidden_layers"))):
            prefix = f"model.layers.{i}"
            attn = QwenMoeAttention(config, build, i, self.rotary_emb, head_dim=head_dim,
                                    qkv_bias=owner.qkv_bias(config), qk_norm=owner.qk_norm,
                                    prefix=f"{prefix}.self_attn")
            if is_moe_layer(config, i):
                mlp: nn.Module = owner.build_moe(config, build, f"{prefix}.mlp")
            else:
                mlp = DenseMLP(hidden, int(config.require("intermediate_size")),
                               config.get("hidden_act", "silu"), build, f"{prefix}.mlp")
            layers.append(QwenMoeDecoderLayer(attn, mlp, hidden, eps, build))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps, build=build)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3MoeForCausalLM(CausalLM):
    """Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): per-head q/k norm, no shared expert."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Qwen3MoeForCausalLM",)
    model_type: ClassVar[str] = "qwen3_moe"
    qk_norm: ClassVar[bool] = True
    weight_name_maps = {"hf": hf_name_map()}
    base_model_prefix = "model"

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        cfg = self.config
        if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
            raise ValueError(f"{type(self).__name__}: hidden_act {cfg.get('hidden_act')!r} is "
                             "not supported (the experts run SwiGLU)")
        self.model = QwenMoeModel(self, cfg, build)
        self.lm_head: LMHead | None = None
        if build.task != "embed":
            tie = bool(cfg.get("tie_word_embeddings", False))
            self.lm_head = LMHead(int(cfg.vocab_size), int(cfg.hidden_size),
                                  tie_with=self.model.embed_tokens if tie else None,
                                  build=build, prefix="lm_head")

    def qkv_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("attention_bias", False))

    def build_moe(self, config: ArchConfig, build: BuildContext, prefix: str) -> FusedMoE:
        """The MoE block of one layer."""
        return FusedMoE(num_experts(config), int(config.hidden_size),
                        int(config.require("moe_intermediate_size")),
                        router=RouterSpec(top_k=int(config.require("num_experts_per_tok")),
                                          renormalize=bool(config.get("norm_topk_prob", False))),
                        build=build, prefix=prefix)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)


class Qwen2MoeForCausalLM(Qwen3MoeForCausalLM):
    """Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): biased q/k/v, no q/k norm, a shared
    expert every token goes through, scaled by a sigmoid gate."""

    hf_architectures = ("Qwen2MoeForCausalLM",)
    model_type = "qwen2_moe"
    qk_norm = False

    def qkv_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("qkv_bias", True))

    def build_moe(self, config: ArchConfig, build: BuildContext, prefix: str) -> FusedMoE:
        shared = int(config.get("shared_expert_intermediate_size") or 0)
        return FusedMoE(num_experts(config), int(config.hidden_size),
                        int(config.require("moe_intermediate_size")),
                        router=RouterSpec(top_k=int(config.require("num_experts_per_tok")),
                                          renormalize=bool(config.get("norm_topk_prob", False))),
                        shared_intermediate_size=shared, shared_gate=bool(shared),
                        build=build, prefix=prefix)
