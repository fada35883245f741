"""Qwen3-Next's (and Qwen3.5's) multi-token prediction layer, the head of
``speculative.method: mtp``.

Checkpoint tensors (one layer; the embedding and the LM head are the model's)::

    mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight   RMSNorms (1 + weight)
    mtp.fc.weight                      [H, 2H] over concat(norm_e(embed(t)), norm_h(h))
    mtp.layers.0.*                     a full-attention decoder layer like the model's
                                       (gated attention, its MoE), names as model.layers.i.*
    mtp.norm.weight                    the final RMSNorm (1 + weight)

One step at position ``p`` (token ``t`` at ``p + 1``, hidden ``h`` at ``p``)::

    x      = fc(concat(pre_fc_norm_embedding(embed(t)), pre_fc_norm_hidden(h)))
    out    = norm(the decoder layer's output plus its residual)
    logits = lm_head(out)

``out`` is the hidden state the next step takes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    BuildContext,
    MTPHead,
    ReplicatedLinear,
    RMSNorm,
    WeightMatch,
    WeightNameMap,
    WeightRule,
)

from .naming import hf_name_map

#: the head's own tensors below ``mtp.``, beside its decoder layer's
_OWN = ("fc.{p}", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight")


class MTPNames:
    """``mtp.*`` checkpoint names onto the head's parameters: its own parts by the same
    names, ``mtp.layers.j.*`` through the model's rules for ``model.layers.j.*``."""

    def __init__(self, layers: WeightNameMap) -> None:
        self.layers = layers
        self.own = WeightNameMap([WeightRule(f"mtp.{n}", n) for n in _OWN])

    def match(self, name: str) -> WeightMatch | None:
        if name.startswith("mtp.layers."):
            return self.layers.match("model.layers." + name[len("mtp.layers.") :])
        return self.own.match(name)


class Qwen3NextMTPHead(MTPHead):
    """The MTP layer of a Qwen3-Next / Qwen3.5 checkpoint (see the module docstring);
    ``owner`` is the model it predicts for (its rotary embedding, embedding and head)."""

    def __init__(self, owner: Any, config: ArchConfig, build: BuildContext) -> None:
        from .model import DecoderLayer

        super().__init__(config, build)
        hidden = int(config.hidden_size)
        eps = float(config.get("rms_norm_eps", 1e-6))
        head_dim = int(config.get("head_dim") or hidden // int(config.num_attention_heads))
        self.fc = ReplicatedLinear(2 * hidden, hidden, False, build=build, prefix="mtp.fc")
        self.pre_fc_norm_embedding = RMSNorm(hidden, eps, offset=True, build=build)
        self.pre_fc_norm_hidden = RMSNorm(hidden, eps, offset=True, build=build)
        # its attention's layer index follows the model's (the head's own cache)
        layer = DecoderLayer(
            config,
            build,
            int(config.num_hidden_layers),
            "full_attention",
            owner.model.rotary_emb,
            head_dim,
        )
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(hidden, eps, offset=True, build=build)
        # a list: the model's modules are not this head's submodules
        self._owner_parts: list[nn.Module] = [owner.model.embed_tokens, owner.lm_head]

    def weight_names(self, naming: str) -> Any:
        if naming != "hf":
            return super().weight_names(naming)
        return MTPNames(hf_name_map())

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.hidden_input(input_ids.shape[0])
        embedded = self._owner_parts[0](input_ids)
        x = self.fc(
            torch.cat(
                [self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], dim=-1
            )
        )
        out, residual = self.model.layers[0](positions, x, None)
        out, _ = self.norm(out, residual)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._owner_parts[1](hidden)
