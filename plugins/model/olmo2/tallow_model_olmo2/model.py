"""OLMo 2 (``Olmo2ForCausalLM``): the Llama decoder with its norms moved.

- No norm before attention or the MLP: each block reads the residual stream as it is, and its
  output is normed (``post_attention_layernorm``, ``post_feedforward_layernorm``) before it is
  added back.
- q and k are RMS-normed over the whole projection (every head at once: weights of
  ``heads * head_dim`` and ``kv_heads * head_dim`` features) before RoPE; with tensor
  parallelism the mean square is summed across ranks (:class:`tallow.layers.ShardedRMSNorm`).
- ``attention_bias`` puts biases on q, k, v and the output projection; the MLP has none.

Tensor names, HF and GGUF, are listed in :mod:`tallow_model_olmo2.naming`.
"""

from __future__ import annotations

import torch
from torch import nn

from tallow.layers import ArchConfig, BuildContext, RMSNorm, RotaryEmbedding, ShardedRMSNorm
from tallow_model_llama.model import LlamaAttention, LlamaForCausalLM, LlamaMLP

from .naming import gguf_name_map, hf_name_map


class Olmo2Attention(LlamaAttention):
    """qkv projection, RMSNorm of all of q and all of k, RoPE, paged attention, output
    projection."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer_index: int,
        rotary: RotaryEmbedding,
        *,
        head_dim: int,
        bias: bool,
        prefix: str,
    ) -> None:
        super().__init__(
            config,
            build,
            layer_index,
            rotary,
            head_dim=head_dim,
            qkv_bias=bias,
            o_bias=bias,
            qk_norm=False,
            sliding_window=None,
            prefix=prefix,
        )
        qkv = self.qkv_proj
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.q_norm = ShardedRMSNorm(
            qkv.total_num_heads * head_dim,
            eps,
            size=qkv.q_size,
            rank_index=build.tp_rank,
            build=build,
        )
        # ranks that share a replicated KV head hold the same slice of the k norm
        self.k_norm = ShardedRMSNorm(
            qkv.total_num_kv_heads * head_dim,
            eps,
            size=qkv.kv_size,
            rank_index=build.tp_rank // qkv.kv_replicas,
            build=build,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        q, k = self.rotary_emb(positions, self.q_norm(q), self.k_norm(k))
        return self.o_proj(self.attn(q, k, v))


class Olmo2DecoderLayer(nn.Module):
    """Attention and MLP blocks on the residual stream, each output normed before the add.

    Keeps the Llama layers' contract (``(hidden, residual)`` in and out, the last add left to
    the next norm): the stream is ``hidden + residual`` on entry, and the MLP's normed output
    is returned for the final norm to add.
    """

    def __init__(
        self, attn: Olmo2Attention, mlp: LlamaMLP, hidden: int, eps: float, build: BuildContext
    ) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.post_attention_layernorm = RMSNorm(hidden, eps, build=build)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, build=build)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = hidden if residual is None else hidden + residual
        stream = stream + self.post_attention_layernorm(self.self_attn(positions, stream))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class Olmo2ForCausalLM(LlamaForCausalLM):
    """OLMo 2 (see the module docstring)."""

    hf_architectures = ("Olmo2ForCausalLM",)
    gguf_architectures = ("olmo2",)
    model_type = "olmo2"
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map()}

    def mlp_bias(self, config: ArchConfig) -> bool:
        return False

    def build_attention(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer: int,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> nn.Module:
        return Olmo2Attention(
            config,
            build,
            layer,
            rotary,
            head_dim=head_dim,
            bias=bool(config.get("attention_bias", False)),
            prefix=prefix,
        )

    def build_decoder_layer(
        self, config: ArchConfig, build: BuildContext, attn: nn.Module, mlp: LlamaMLP
    ) -> nn.Module:
        return Olmo2DecoderLayer(
            attn, mlp, int(config.hidden_size), float(config.get("rms_norm_eps", 1e-6)), build
        )
