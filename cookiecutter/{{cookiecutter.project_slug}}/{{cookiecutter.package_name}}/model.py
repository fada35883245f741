{% raw %}"""The Arcee (AFM) architecture on tallow's building blocks: a Llama-style decoder whose MLP is
not gated, ``down(relu(up(x)) ** 2)``.

Hugging Face names (``naming="hf"``) → parameters:

    model.embed_tokens.weight                 → same name
    model.layers.i.self_attn.{q,k,v}_proj.*   → model.layers.i.self_attn.qkv_proj.* (shard q/k/v)
    model.layers.i.self_attn.o_proj.*         → same name
    model.layers.i.mlp.{up,down}_proj.*       → same name
    model.layers.i.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from tallow.layers import (
    ArchConfig, Attention, BuildContext, CausalLM, ColumnParallelLinear, LMHead, QKVParallelLinear,
    RMSNorm, RowParallelLinear, VocabEmbedding, WeightNameMap, WeightRule, get_rope,
    rope_parameters,
)

_L = "model.layers.{i}"


def hf_name_map() -> WeightNameMap:
    return WeightNameMap([
        WeightRule("model.embed_tokens.weight", "model.embed_tokens.weight"),
        WeightRule(f"{_L}.self_attn.q_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="q"),
        WeightRule(f"{_L}.self_attn.k_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="k"),
        WeightRule(f"{_L}.self_attn.v_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="v"),
        WeightRule(f"{_L}.self_attn.o_proj.{{p}}", f"{_L}.self_attn.o_proj.{{p}}"),
        WeightRule(f"{_L}.self_attn.rotary_emb.inv_freq"),  # recomputed
        WeightRule(f"{_L}.mlp.up_proj.{{p}}", f"{_L}.mlp.up_proj.{{p}}"),
        WeightRule(f"{_L}.mlp.down_proj.{{p}}", f"{_L}.mlp.down_proj.{{p}}"),
        WeightRule(f"{_L}.input_layernorm.weight", f"{_L}.input_layernorm.weight"),
        WeightRule(f"{_L}.post_attention_layernorm.weight",
                   f"{_L}.post_attention_layernorm.weight"),
        WeightRule("model.norm.weight", "model.norm.weight"),
        WeightRule("lm_head.weight", "lm_head.weight"),
    ])


class ArceeMLP(nn.Module):
    """``down(relu(up(x)) ** 2)``."""

    def __init__(self, hidden: int, intermediate: int, bias: bool, build: BuildContext,
                 prefix: str) -> None:
        super().__init__()
        self.up_proj = ColumnParallelLinear(hidden, intermediate, bias, build=build,
                                            prefix=f"{prefix}.up_proj")
        self.down_proj = RowParallelLinear(intermediate, hidden, bias, build=build,
                                           prefix=f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.relu(self.up_proj(x)).square())


class ArceeAttention(nn.Module):
    def __init__(self, config: ArchConfig, build: BuildContext, index: int, rotary: nn.Module,
                 head_dim: int, prefix: str) -> None:
        super().__init__()
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        bias = bool(config.get("attention_bias", False))
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, heads, kv_heads, bias, build=build,
                                          prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(heads * head_dim, hidden, bias, build=build,
                                        prefix=f"{prefix}.o_proj")
        self.rotary_emb = rotary
        self.attn = Attention(index, self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads,
                              head_dim)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class ArceeDecoderLayer(nn.Module):
    def __init__(self, config: ArchConfig, build: BuildContext, index: int, rotary: nn.Module,
                 head_dim: int) -> None:
        super().__init__()
        prefix = f"model.layers.{index}"
        hidden, eps = int(config.hidden_size), float(config.get("rms_norm_eps", 1e-5))
        self.self_attn = ArceeAttention(config, build, index, rotary, head_dim,
                                        f"{prefix}.self_attn")
        self.mlp = ArceeMLP(hidden, int(config.intermediate_size),
                            bool(config.get("mlp_bias", False)), build, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(hidden, eps, build=build)
        self.post_attention_layernorm = RMSNorm(hidden, eps, build=build)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class ArceeModel(nn.Module):
    def __init__(self, config: ArchConfig, build: BuildContext) -> None:
        super().__init__()
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        base, scaling, partial = rope_parameters(config)
        self.rotary_emb = get_rope(head_dim, int(head_dim * partial),
                                   int(config.get("max_position_embeddings") or 4096), base,
                                   scaling, is_neox_style=True, device=build.device)
        self.embed_tokens = VocabEmbedding(int(config.vocab_size), hidden, build=build,
                                           prefix="model.embed_tokens")
        self.layers = nn.ModuleList(
            ArceeDecoderLayer(config, build, i, self.rotary_emb, head_dim)
            for i in range(int(config.num_hidden_layers)))
        self.norm = RMSNorm(hidden, float(config.get("rms_norm_eps", 1e-5)), build=build)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        return self.norm(hidden, residual)[0]


class ArceeForCausalLM(CausalLM):
    hf_architectures: ClassVar[tuple[str, ...]] = ("ArceeForCausalLM",)
    weight_name_maps = {"hf": hf_name_map()}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        cfg = self.config
        if cfg.get("hidden_act", "relu2") != "relu2":
            raise ValueError(f"model config: hidden_act {cfg.hidden_act!r} is not supported "
                             "(Arcee uses 'relu2')")
        self.model = ArceeModel(cfg, build)
        tied = bool(cfg.get("tie_word_embeddings", False))
        self.lm_head = LMHead(int(cfg.vocab_size), int(cfg.hidden_size),
                              tie_with=self.model.embed_tokens if tied else None, build=build,
                              prefix="lm_head")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions){% endraw %}
