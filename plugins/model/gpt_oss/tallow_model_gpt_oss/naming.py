"""How gpt-oss checkpoint names map onto the model's parameters: tallow-model-llama's map (attention
with biases, norms, embeddings, head) plus, for layer ``i``::

    model.layers.i.self_attn.attn.sinks        [Hq]       <- self_attn.sinks
    model.layers.i.mlp.gate.weight, .bias      [E, H]     <- mlp.router.weight, .bias
    model.layers.i.mlp.experts.w13_weight      [E, 2I, H] <- mlp.experts.gate_up_proj [E, H, 2I]
    model.layers.i.mlp.experts.w13_bias        [E, 2I]    <- mlp.experts.gate_up_proj_bias
    model.layers.i.mlp.experts.w2_weight       [E, H, I]  <- mlp.experts.down_proj [E, I, H]
    model.layers.i.mlp.experts.w2_bias         [E, H]     <- mlp.experts.down_proj_bias

and, for the MXFP4 checkpoints gpt-oss is published as (``quantization_config.quant_method:
mxfp4``; the parameters are those of tallow-quant-fp4's MXFP4 experts)::

    model.layers.i.mlp.experts.w13_blocks  [E, 2I, H/32, 16] <- mlp.experts.gate_up_proj_blocks
    model.layers.i.mlp.experts.w13_scales  [E, 2I, H/32]     <- mlp.experts.gate_up_proj_scales
    model.layers.i.mlp.experts.w2_blocks   [E, H, I/32, 16]  <- mlp.experts.down_proj_blocks
    model.layers.i.mlp.experts.w2_scales   [E, H, I/32]      <- mlp.experts.down_proj_scales

Two layouts differ from the core's: gpt-oss stores each expert's gate and up features
**interleaved** along ``2I`` (feature ``2j`` is gate ``j``, ``2j + 1`` up ``j``; transformers'
``GptOssExperts`` reads ``gate_up[..., ::2]`` and ``[..., 1::2]``), where
:class:`tallow.layers.FusedMoE` keeps the gate rows then the up rows; and its float tensors are
transposed (``x @ gate_up_proj``: ``[E, H, 2I]``, ``[E, I, H]``), where the core's are
``[E, out, in]``. The MXFP4 blocks are already ``[E, out, in / 32, 16]`` (transformers
transposes them after dequantizing), so they only have their gate/up rows sorted apart.
"""

from __future__ import annotations

import torch

from tallow.layers import WeightNameMap, WeightRule
from tallow_model_llama.naming import hf_name_map as llama_hf_name_map

_L = "model.layers.{i}"
_EXPERTS = f"{_L}.mlp.experts"


def split_interleaved_gate_up(tensor: torch.Tensor) -> torch.Tensor:
    """``[E, 2I, ...]`` with gate and up features interleaved along dim 1 → the gate rows,
    then the up rows."""
    if tensor.dim() < 2 or tensor.shape[1] % 2:
        raise ValueError(
            f"gate/up tensor of shape {tuple(tensor.shape)}: expected [experts, "
            "2 * intermediate, ...]"
        )
    return torch.cat([tensor[:, 0::2], tensor[:, 1::2]], dim=1)


def gate_up_from_hf(tensor: torch.Tensor) -> torch.Tensor:
    """transformers' float ``gate_up_proj [E, H, 2I]`` (interleaved) → ``[E, 2I, H]``, gate rows
    then up rows."""
    if tensor.dim() != 3:
        raise ValueError(
            f"gate_up_proj of shape {tuple(tensor.shape)}: expected [experts, "
            "hidden, 2 * intermediate]"
        )
    return split_interleaved_gate_up(tensor.transpose(1, 2))


def down_from_hf(tensor: torch.Tensor) -> torch.Tensor:
    """transformers' float ``down_proj [E, I, H]`` → ``[E, H, I]``."""
    if tensor.dim() != 3:
        raise ValueError(
            f"down_proj of shape {tuple(tensor.shape)}: expected [experts, intermediate, hidden]"
        )
    return tensor.transpose(1, 2)


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names (float and MXFP4 checkpoints)."""
    split = "split_gate_up"
    return llama_hf_name_map() + [
        WeightRule(f"{_L}.self_attn.sinks", f"{_L}.self_attn.attn.sinks"),
        WeightRule(f"{_L}.mlp.router.{{kind}}", f"{_L}.mlp.gate.{{kind}}"),
        WeightRule(
            f"{_EXPERTS}.gate_up_proj", f"{_EXPERTS}.w13_weight", transform="gate_up_from_hf"
        ),
        WeightRule(f"{_EXPERTS}.gate_up_proj_bias", f"{_EXPERTS}.w13_bias", transform=split),
        WeightRule(f"{_EXPERTS}.down_proj", f"{_EXPERTS}.w2_weight", transform="down_from_hf"),
        WeightRule(f"{_EXPERTS}.down_proj_bias", f"{_EXPERTS}.w2_bias"),
        WeightRule(f"{_EXPERTS}.gate_up_proj_blocks", f"{_EXPERTS}.w13_blocks", transform=split),
        WeightRule(f"{_EXPERTS}.gate_up_proj_scales", f"{_EXPERTS}.w13_scales", transform=split),
        WeightRule(f"{_EXPERTS}.down_proj_blocks", f"{_EXPERTS}.w2_blocks"),
        WeightRule(f"{_EXPERTS}.down_proj_scales", f"{_EXPERTS}.w2_scales"),
    ]
