"""GPT-NeoX (GPT-NeoX-20B, the Pythia suite) on tallow's building blocks.

What sets it apart from a Llama-style decoder:

- LayerNorm with a bias, not RMSNorm;
- a plain MLP, ``dense_4h_to_h(act(dense_h_to_4h(x)))`` with biases, not a gated one;
- rotary embedding on only the first ``rotary_pct`` of each head's features;
- q, k and v in one fused ``query_key_value`` projection whose checkpoint rows are grouped
  per head (reordered on load, see :mod:`tallow_model_gptneox.naming`);
- with ``use_parallel_residual`` (the default) attention and MLP read the same input:
  ``x + attn(ln1(x)) + mlp(ln2(x))``; without it they run one after the other.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    CausalLM,
    ColumnParallelLinear,
    LayerNorm,
    LMHead,
    QKVParallelLinear,
    RotaryEmbedding,
    RowParallelLinear,
    VocabEmbedding,
    get_act,
    rope_from_config,
)

from .naming import hf_name_map

#: transformers' default for a GPT-NeoX config that gives no rotary fraction at all
DEFAULT_ROTARY_PCT = 0.25


def head_dim(config: ArchConfig) -> int:
    """``hidden_size / num_attention_heads``; the config has no separate head size."""
    hidden = int(config.require("hidden_size"))
    heads = int(config.require("num_attention_heads"))
    if hidden % heads:
        raise ValueError(
            f"model config: hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
        )
    return hidden // heads


class GPTNeoXAttention(nn.Module):
    """Fused qkv projection, partial rotary, paged attention, output projection."""

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
        head_size = head_dim(config)
        bias = bool(config.get("attention_bias", True))
        # GPT-NeoX has as many KV heads as query heads (no grouped-query attention).
        self.query_key_value = QKVParallelLinear(
            hidden, head_size, heads, heads, bias, build=build, prefix=f"{prefix}.query_key_value"
        )
        self.dense = RowParallelLinear(hidden, hidden, bias, build=build, prefix=f"{prefix}.dense")
        self.rotary_emb = rotary
        # Attention takes this rank's head counts, which the projection has worked out.
        self.attn = Attention(
            layer_index,
            self.query_key_value.num_heads,
            self.query_key_value.num_kv_heads,
            head_size,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query_key_value.split(self.query_key_value(hidden))
        q, k = self.rotary_emb(positions, q, k)
        return self.dense(self.attn(q, k, v))


class GPTNeoXMLP(nn.Module):
    """``dense_4h_to_h(act(dense_h_to_4h(x)))``, both projections with biases."""

    def __init__(self, config: ArchConfig, build: BuildContext, prefix: str) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        inner = int(config.require("intermediate_size"))
        self.dense_h_to_4h = ColumnParallelLinear(
            hidden, inner, bias=True, build=build, prefix=f"{prefix}.dense_h_to_4h"
        )
        self.dense_4h_to_h = RowParallelLinear(
            inner, hidden, bias=True, build=build, prefix=f"{prefix}.dense_4h_to_h"
        )
        self.act = get_act(config.get("hidden_act", "gelu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class GPTNeoXLayer(nn.Module):
    """One decoder layer: two LayerNorms, attention and MLP, parallel or sequential."""

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
        self.use_parallel_residual = bool(config.get("use_parallel_residual", True))
        self.input_layernorm = LayerNorm(hidden, eps, build=build)
        self.post_attention_layernorm = LayerNorm(hidden, eps, build=build)
        self.attention = GPTNeoXAttention(config, build, layer_index, rotary, f"{prefix}.attention")
        self.mlp = GPTNeoXMLP(config, build, f"{prefix}.mlp")

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        attn = self.attention(positions, self.input_layernorm(hidden))
        if self.use_parallel_residual:
            # x + attn(ln1(x)) + mlp(ln2(x)), summed in transformers' order
            mlp = self.mlp(self.post_attention_layernorm(hidden))
            return mlp + attn + hidden
        hidden = attn + hidden
        return self.mlp(self.post_attention_layernorm(hidden)) + hidden


class GPTNeoXModel(nn.Module):
    """Token embedding, the decoder layers, the final LayerNorm."""

    def __init__(self, config: ArchConfig, build: BuildContext) -> None:
        super().__init__()
        hidden = int(config.require("hidden_size"))
        rope_config = {"rotary_pct": DEFAULT_ROTARY_PCT, **config}
        # One rotary table shared by every layer.
        self.rotary_emb = rope_from_config(rope_config, head_dim(config), device=build.device)
        self.embed_in = VocabEmbedding(
            int(config.require("vocab_size")), hidden, build=build, prefix="gpt_neox.embed_in"
        )
        self.layers = nn.ModuleList(
            GPTNeoXLayer(config, build, i, self.rotary_emb, f"gpt_neox.layers.{i}")
            for i in range(int(config.require("num_hidden_layers")))
        )
        self.final_layer_norm = LayerNorm(
            hidden, float(config.get("layer_norm_eps", 1e-5)), build=build
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_in(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden)
        return self.final_layer_norm(hidden)


class GPTNeoXForCausalLM(CausalLM):
    """GPT-NeoX-20B and Pythia, from Hugging Face checkpoints."""

    hf_architectures = ("GPTNeoXForCausalLM",)
    weight_name_maps = {"hf": hf_name_map()}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        cfg = self.config
        self.gpt_neox = GPTNeoXModel(cfg, build)
        tie = bool(cfg.get("tie_word_embeddings", False))
        self.lm_head = LMHead(
            int(cfg.vocab_size),
            int(cfg.hidden_size),
            tie_with=self.gpt_neox.embed_in if tie else None,
            build=build,
            prefix="lm_head",
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.gpt_neox(input_ids, positions)

    def split_heads_qkv(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """Checkpoint rows ``[head][q | k | v][head_dim]`` -> ``[q | k | v][head][head_dim]``.

        Only whole rows move, so this also applies to the rows of a still-quantized weight.
        """
        heads = int(self.config.num_attention_heads)
        rows = tensor.shape[0]
        if rows % (3 * heads):
            raise ValueError(
                f"query_key_value: {rows} rows do not split into q, k and v of {heads} heads"
            )
        per_head = tensor.reshape(heads, 3, rows // (3 * heads), *tensor.shape[1:])
        return per_head.transpose(0, 1).reshape(tensor.shape)
