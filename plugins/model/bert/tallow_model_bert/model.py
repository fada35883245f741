"""BERT-family encoders: BERT, RoBERTa and XLM-RoBERTa on one post-norm encoder.

Each layer is ``x = LN(x + attn(x))``, ``x = LN(x + ffn(x))`` with bidirectional attention
(``Attention(..., causal=False)``: every token sees the whole input), LayerNorms with a bias and
a GELU feed-forward (``hidden_act`` by name, :func:`tallow.layers.get_act`). The input is the
sum of the token, absolute position and token-type embeddings, normalized. Inputs are single
texts, so every token has type 0. RoBERTa and XLM-RoBERTa count positions from
``pad_token_id + 1`` (their position table keeps the first rows for padding) and have one
token type.

The model makes hidden states only; the engine pools them into embeddings
(:mod:`tallow.layers.pooling`). Checkpoint names: :mod:`tallow_model_bert.naming`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    ColumnParallelLinear,
    EncoderModel,
    LayerNorm,
    QKVParallelLinear,
    RowParallelLinear,
    VocabEmbedding,
    default_weight_loader,
    get_act,
)

from .naming import hf_name_map


def _table(rows: int, dim: int, build: BuildContext) -> nn.Parameter:
    param = nn.Parameter(
        torch.empty(rows, dim, dtype=build.dtype, device=build.device), requires_grad=False
    )
    param.weight_loader = default_weight_loader
    return param


class BertEmbeddings(nn.Module):
    def __init__(self, config: ArchConfig, build: BuildContext, position_offset: int) -> None:
        super().__init__()
        hidden = int(config.require("hidden_size"))
        self.position_offset = position_offset
        self.word_embeddings = VocabEmbedding(
            int(config.require("vocab_size")),
            hidden,
            build=build,
            prefix="embeddings.word_embeddings",
        )
        self.position_embeddings = nn.Module()
        self.position_embeddings.weight = _table(
            int(config.require("max_position_embeddings")), hidden, build
        )
        self.token_type_embeddings = nn.Module()
        self.token_type_embeddings.weight = _table(
            int(config.get("type_vocab_size") or 2), hidden, build
        )
        self.LayerNorm = LayerNorm(hidden, float(config.get("layer_norm_eps", 1e-12)), build=build)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        x = x + self.position_embeddings.weight.index_select(0, positions + self.position_offset)
        x = x + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, config: ArchConfig, build: BuildContext, layer: int, prefix: str) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.require("num_attention_heads"))
        if hidden % heads:
            raise ValueError(
                f"model config: hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}"
            )
        head_dim = hidden // heads
        self.qkv_proj = QKVParallelLinear(
            hidden, head_dim, heads, heads, True, build=build, prefix=f"{prefix}.qkv_proj"
        )
        self.attn = Attention(
            layer,
            self.qkv_proj.num_heads,
            self.qkv_proj.num_kv_heads,
            head_dim,
            scale=head_dim**-0.5,
            causal=False,
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        return self.attn(q, k, v)


class BertOutput(nn.Module):
    """``LN(residual + dense(x))``: the end of the attention block and of the feed-forward."""

    def __init__(
        self, in_features: int, hidden: int, eps: float, build: BuildContext, prefix: str
    ) -> None:
        super().__init__()
        self.dense = RowParallelLinear(
            in_features, hidden, True, build=build, prefix=f"{prefix}.dense"
        )
        self.LayerNorm = LayerNorm(hidden, eps, build=build)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dense(x))


class BertAttention(nn.Module):
    def __init__(
        self, config: ArchConfig, build: BuildContext, layer: int, eps: float, prefix: str
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        self.self = BertSelfAttention(config, build, layer, f"{prefix}.self")
        self.output = BertOutput(hidden, hidden, eps, build, f"{prefix}.output")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(hidden), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: ArchConfig, build: BuildContext, prefix: str) -> None:
        super().__init__()
        self.dense = ColumnParallelLinear(
            int(config.hidden_size),
            int(config.require("intermediate_size")),
            True,
            build=build,
            prefix=f"{prefix}.dense",
        )
        self.act = get_act(str(config.get("hidden_act", "gelu")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: ArchConfig, build: BuildContext, layer: int) -> None:
        super().__init__()
        prefix = f"encoder.layer.{layer}"
        eps = float(config.get("layer_norm_eps", 1e-12))
        self.attention = BertAttention(config, build, layer, eps, f"{prefix}.attention")
        self.intermediate = BertIntermediate(config, build, f"{prefix}.intermediate")
        self.output = BertOutput(
            int(config.intermediate_size), int(config.hidden_size), eps, build, f"{prefix}.output"
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.attention(hidden)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(self, config: ArchConfig, build: BuildContext) -> None:
        super().__init__()
        n_layers = int(config.require("num_hidden_layers"))
        self.layer = nn.ModuleList(BertLayer(config, build, i) for i in range(n_layers))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden)
        return hidden


class BertModel(EncoderModel):
    """BERT: absolute positions from 0, token types, post-norm encoder layers."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("BertModel",)
    weight_name_maps = {"hf": hf_name_map()}
    base_model_prefix: ClassVar[str | None] = "bert"

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        cfg = self.config
        kind = cfg.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(
                f"model config: position_embedding_type {kind!r} is not supported "
                "(expected 'absolute')"
            )
        self.embeddings = BertEmbeddings(cfg, build, self.position_offset(cfg))
        self.encoder = BertEncoder(cfg, build)

    @classmethod
    def position_offset(cls, config: ArchConfig) -> int:
        """The row of the position table of a sequence's first token."""
        return 0

    def position_limit(self) -> int:
        """The longest input the position table covers."""
        rows = self.embeddings.position_embeddings.weight.shape[0]
        return rows - self.embeddings.position_offset

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embeddings(input_ids, positions))


class RobertaModel(BertModel):
    """RoBERTa: BERT with positions counted from ``pad_token_id + 1``."""

    hf_architectures = ("RobertaModel",)
    base_model_prefix = "roberta"

    @classmethod
    def position_offset(cls, config: ArchConfig) -> int:
        return int(config.get("pad_token_id") if config.get("pad_token_id") is not None else 1) + 1


class XLMRobertaModel(RobertaModel):
    """XLM-RoBERTa: RoBERTa's architecture with a multilingual vocabulary."""

    hf_architectures = ("XLMRobertaModel",)
