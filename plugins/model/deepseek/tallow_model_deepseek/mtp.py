"""DeepSeek-V3's multi-token prediction layer (also GLM-4.5's and GLM-4.7-Flash's: tallow-model-glm4-moe
uses this module), the head of ``speculative.method: mtp``.

Checkpoints of ``num_nextn_predict_layers`` layers keep them after the decoder's, as
``model.layers.{num_hidden_layers + j}``; the head runs the first (``L = num_hidden_layers``),
whose tensors are::

    model.layers.L.enorm.weight, hnorm.weight     RMSNorms of the token embedding, of the hidden
    model.layers.L.eh_proj.weight                 [H, 2H] over concat(enorm(e), hnorm(h))
    model.layers.L.embed_tokens.weight            the embedding (the model's when absent)
    model.layers.L.shared_head.norm.weight        the norm before the head
    model.layers.L.shared_head.head.weight        the head (the model's lm_head when absent)
    model.layers.L.{self_attn, mlp, input_layernorm, post_attention_layernorm}.*
                                                  a decoder layer like the model's (MoE from
                                                  first_k_dense_replace on)

One step at position ``p`` (token ``t`` at ``p + 1``, hidden ``h`` at ``p``)::

    e   = embed_tokens(t)        (zeros at position 0)
    x   = eh_proj(concat(enorm(e), hnorm(h)))
    out = x' + mlp(...)          the decoder layer's output with its residual added (no norm)
    logits = shared_head.head(shared_head.norm(out))

``out`` is the hidden state the next step takes.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    BuildContext,
    LMHead,
    MTPHead,
    QuantizedWeight,
    ReplicatedLinear,
    RMSNorm,
    VocabEmbedding,
    WeightNameMap,
    WeightRule,
)

from .naming import mtp_layer

#: the MTP layer's own tensors, beside those of its decoder layer
HEAD_PARTS = ("enorm", "hnorm", "eh_proj", "embed_tokens", "shared_head.norm", "shared_head.head")

Tensors = Iterable[tuple[str, "torch.Tensor | QuantizedWeight"]]


def mtp_name_map(layers: WeightNameMap) -> WeightNameMap:
    """Checkpoint names of the MTP layer onto the head's parameters (the same names): its
    own parts, then ``layers``, the model's map, for its decoder layer."""
    own = [
        WeightRule(f"model.layers.{{i}}.{part}.{{p}}", f"model.layers.{{i}}.{part}.{{p}}")
        for part in HEAD_PARTS
    ]
    return WeightNameMap(own) + layers


def build_mtp_head(owner: Any, build: BuildContext) -> "list[DeepseekMTPHead]":
    """``owner``'s head in a list (not a submodule of the model) when ``build.mtp`` asks for
    it and its config declares ``num_nextn_predict_layers``; an empty list otherwise."""
    config = owner.config
    if build.mtp and int(config.get("num_nextn_predict_layers") or 0) > 0:
        return [DeepseekMTPHead(owner, config, build)]
    return []


def model_tensors(
    tensors: Tensors, num_hidden_layers: int, head_tensors: list | None
) -> Iterator[tuple[str, "torch.Tensor | QuantizedWeight"]]:
    """The model's own tensors of ``tensors``; those of the first MTP layer go to
    ``head_tensors`` (when a list: the head is built), every other MTP layer's are skipped."""
    for name, tensor in tensors:
        if not mtp_layer(name, num_hidden_layers):
            yield name, tensor
        elif head_tensors is not None and not mtp_layer(name, num_hidden_layers + 1):
            head_tensors.append((name, tensor))


class DeepseekMTPHead(MTPHead):
    """The first MTP layer of a DeepSeek-V3-style checkpoint (see the module docstring).
    ``owner`` is the model it predicts for: its layer builders, rotary embedding, embedding
    and head (used where the checkpoint has none of the layer's own), and its name map."""

    def __init__(self, owner: Any, config: ArchConfig, build: BuildContext) -> None:
        super().__init__(config, build)
        self._names = mtp_name_map(owner.weight_names("hf"))
        hidden = int(config.hidden_size)
        vocab = int(config.vocab_size)
        eps = float(config.get("rms_norm_eps", 1e-6))
        index = int(config.num_hidden_layers)
        self.index = index
        prefix = f"model.layers.{index}"
        head_dim = int(config.get("head_dim") or hidden // int(config.num_attention_heads))
        attn = owner.build_attention(
            config, build, index, owner.model.rotary_emb, head_dim, f"{prefix}.self_attn"
        )
        mlp = owner.build_mlp(config, build, index, f"{prefix}.mlp")
        layer = owner.build_decoder_layer(config, build, attn, mlp)
        layer.enorm = RMSNorm(hidden, eps, build=build)
        layer.hnorm = RMSNorm(hidden, eps, build=build)
        layer.eh_proj = ReplicatedLinear(
            2 * hidden, hidden, False, build=build, prefix=f"{prefix}.eh_proj"
        )
        layer.embed_tokens = VocabEmbedding(
            vocab, hidden, build=build, prefix=f"{prefix}.embed_tokens"
        )
        shared = nn.Module()
        shared.norm = RMSNorm(hidden, eps, build=build)
        shared.head = LMHead(vocab, hidden, build=build, prefix=f"{prefix}.shared_head.head")
        layer.shared_head = shared
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({str(index): layer})
        # a list: the model's modules are not this head's submodules
        self._owner_parts: list[nn.Module] = [owner.model.embed_tokens, owner.lm_head]

    def weight_names(self, naming: str) -> WeightNameMap:
        return self._names if naming == "hf" else super().weight_names(naming)

    @property
    def layer(self) -> nn.Module:
        return self.model.layers[str(self.index)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        hidden = self.hidden_input(input_ids.shape[0])
        embedded = layer.embed_tokens(input_ids)
        embedded = embedded.masked_fill((positions == 0).unsqueeze(-1), 0.0)
        x = layer.eh_proj(torch.cat([layer.enorm(embedded), layer.hnorm(hidden)], dim=-1))
        out, residual = layer(positions, x, None)
        return out + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        shared = self.layer.shared_head
        return shared.head(shared.norm(hidden))

    def resolve_missing(self, missing: set[str], naming: str) -> set[str]:
        """The embedding and the head the checkpoint's MTP layer lacks are the model's."""
        prefix = f"model.layers.{self.index}"
        resolved = set()
        layer = self.layer
        embed, head = self._owner_parts
        if f"{prefix}.embed_tokens.weight" in missing:
            layer.embed_tokens = embed
            resolved.add(f"{prefix}.embed_tokens.weight")
        if f"{prefix}.shared_head.head.weight" in missing and head is not None:
            layer.shared_head.head = head
            resolved.add(f"{prefix}.shared_head.head.weight")
        return resolved

    def process_weights_after_loading(self) -> None:
        super().process_weights_after_loading()
        absorb = getattr(self.layer.self_attn, "attn", None)
        if absorb is not None and hasattr(absorb, "absorb"):
            absorb.absorb(self.layer.self_attn.kv_b_proj)
