"""StableLM (StableLM-3B-4E1T, StableLM 2, StableCode) beside GPT-NeoX.

It shares GPT-NeoX's LayerNorm with bias, partial rotary and optional parallel residual, but
is otherwise a Llama-shaped decoder: separate q/k/v projections with grouped-query heads and an
optional bias (``use_qkv_bias``), an output projection without bias, a gated SiLU MLP, and
optionally a LayerNorm over each head of q and k with weights of its own per head
(``qk_layernorm``). With ``use_parallel_residual`` one norm feeds both blocks:
``x + attn(ln(x)) + mlp(ln(x))``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    CausalLM,
    LayerNorm,
    LMHead,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RotaryEmbedding,
    RowParallelLinear,
    VocabEmbedding,
    WeightNameMap,
    WeightRule,
    get_act_and_mul,
    rope_from_config,
)

from .model import head_dim

#: transformers' default for a StableLM config that gives no rotary fraction
DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25

_L = "model.layers.{i}"


def hf_name_map() -> WeightNameMap:
    """Hugging Face names of ``StableLmForCausalLM``; q/k/v and gate/up load as shards of the
    merged projections, everything else keeps its name."""
    same = [
        f"{_L}.self_attn.o_proj.weight",
        f"{_L}.mlp.down_proj.weight",
        f"{_L}.self_attn.q_layernorm.norms.{{h}}.weight",
        f"{_L}.self_attn.k_layernorm.norms.{{h}}.weight",
        f"{_L}.input_layernorm.{{p}}",
        f"{_L}.post_attention_layernorm.{{p}}",
        "model.embed_tokens.weight",
        "model.norm.{p}",
        "lm_head.weight",
    ]
    return WeightNameMap(
        [
            *(
                WeightRule(
                    f"{_L}.self_attn.{s}_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard=s
                )
                for s in ("q", "k", "v")
            ),
            WeightRule(f"{_L}.mlp.gate_proj.weight", f"{_L}.mlp.gate_up_proj.weight", shard=0),
            WeightRule(f"{_L}.mlp.up_proj.weight", f"{_L}.mlp.gate_up_proj.weight", shard=1),
            *(WeightRule(name, name) for name in same),
            WeightRule(f"{_L}.self_attn.rotary_emb.inv_freq"),
        ]
    )


class PerHeadLayerNorm(nn.Module):
    """A bias-free LayerNorm over each head of ``x [T, heads * head_dim]``, with a weight of
    its own per head (``norms.<h>.weight``, the checkpoint's names)."""

    def __init__(self, num_heads: int, head_size: int, eps: float, build: BuildContext) -> None:
        super().__init__()
        self.head_size = head_size
        self.eps = eps
        self.norms = nn.ModuleList(
            LayerNorm(head_size, eps, bias=False, build=build) for _ in range(num_heads)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], len(self.norms), self.head_size)
        weight = torch.stack([norm.weight for norm in self.norms])
        return (F.layer_norm(heads, (self.head_size,), eps=self.eps) * weight).view(x.shape)


class StableLmAttention(nn.Module):
    """q/k/v projection (grouped-query), optional per-head q/k LayerNorm, partial rotary."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer_index: int,
        rotary: RotaryEmbedding,
        prefix: str,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_size = head_dim(config)
        self.qkv_proj = QKVParallelLinear(
            hidden,
            head_size,
            heads,
            kv_heads,
            bool(config.get("use_qkv_bias", False)),
            build=build,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            heads * head_size, hidden, False, build=build, prefix=f"{prefix}.o_proj"
        )
        self.q_layernorm = self.k_layernorm = None
        if config.get("qk_layernorm", False):
            if build.tp_size > 1:
                raise ValueError(
                    "StableLM with qk_layernorm: per-head norms are not sharded "
                    "across tensor-parallel ranks"
                )
            eps = float(config.get("layer_norm_eps", 1e-5))
            self.q_layernorm = PerHeadLayerNorm(heads, head_size, eps, build)
            self.k_layernorm = PerHeadLayerNorm(kv_heads, head_size, eps, build)
        self.rotary_emb = rotary
        self.attn = Attention(
            layer_index, self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, head_size
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        if self.q_layernorm is not None and self.k_layernorm is not None:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class StableLmMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` without biases; gate and up stored as one matrix."""

    def __init__(self, config: ArchConfig, build: BuildContext, prefix: str) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        inner = int(config.require("intermediate_size"))
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [inner, inner], False, build=build, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            inner, hidden, False, build=build, prefix=f"{prefix}.down_proj"
        )
        self.act = get_act_and_mul(config.get("hidden_act", "silu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), act=self.act)


class StableLmDecoderLayer(nn.Module):
    """Sequential: two LayerNorms. Parallel residual: one LayerNorm feeding both blocks."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer_index: int,
        rotary: RotaryEmbedding,
        prefix: str,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        eps = float(config.get("layer_norm_eps", 1e-5))
        self.use_parallel_residual = bool(config.get("use_parallel_residual", False))
        self.input_layernorm = LayerNorm(hidden, eps, build=build)
        self.post_attention_layernorm = (
            None if self.use_parallel_residual else LayerNorm(hidden, eps, build=build)
        )
        self.self_attn = StableLmAttention(
            config, build, layer_index, rotary, f"{prefix}.self_attn"
        )
        self.mlp = StableLmMLP(config, build, f"{prefix}.mlp")

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.input_layernorm(hidden)
        attn = self.self_attn(positions, normed)
        if self.post_attention_layernorm is None:
            return hidden + attn + self.mlp(normed)  # transformers' order of the sums
        hidden = hidden + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class StableLmModel(nn.Module):
    """Token embedding, the decoder layers, the final LayerNorm."""

    def __init__(self, config: ArchConfig, build: BuildContext) -> None:
        super().__init__()
        hidden = int(config.require("hidden_size"))
        rope_config = {"partial_rotary_factor": DEFAULT_PARTIAL_ROTARY_FACTOR, **config}
        self.rotary_emb = rope_from_config(rope_config, head_dim(config), device=build.device)
        self.embed_tokens = VocabEmbedding(
            int(config.require("vocab_size")), hidden, build=build, prefix="model.embed_tokens"
        )
        self.layers = nn.ModuleList(
            StableLmDecoderLayer(config, build, i, self.rotary_emb, f"model.layers.{i}")
            for i in range(int(config.require("num_hidden_layers")))
        )
        self.norm = LayerNorm(hidden, float(config.get("layer_norm_eps", 1e-5)), build=build)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden)
        return self.norm(hidden)


class StableLmForCausalLM(CausalLM):
    """StableLM-3B-4E1T, StableLM 2 and StableCode, from Hugging Face checkpoints."""

    hf_architectures = ("StableLmForCausalLM",)
    weight_name_maps = {"hf": hf_name_map()}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        cfg = self.config
        self.model = StableLmModel(cfg, build)
        tie = bool(cfg.get("tie_word_embeddings", False))
        self.lm_head = LMHead(
            int(cfg.vocab_size),
            int(cfg.hidden_size),
            tie_with=self.model.embed_tokens if tie else None,
            build=build,
            prefix="lm_head",
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)
