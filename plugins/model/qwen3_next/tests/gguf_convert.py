"""The GGUF files llama.cpp's converter (``convert_hf_to_gguf.py``, its Qwen3-Next and Qwen3.5
classes) writes for a transformers Qwen3-Next / Qwen3.5 text model, for the plugin's tests:
the same metadata keys and the same tensor changes, named by the ``gguf`` package's map.

Per tensor, as the converter does it:

- ``qwen35`` / ``qwen35moe`` with fewer key than value heads: the linear-attention value heads
  are reordered from grouped by key head to tiled (the value rows of ``in_proj_qkv``, the rows of
  ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, the entries of ``A_log`` and ``dt_bias``, the value
  channels of ``conv1d``, the columns of ``out_proj``);
- ``A_log`` → ``-exp(A_log)``; ``dt_bias`` → ``dt_proj.bias``; ``conv1d.weight`` squeezed to
  ``[C, K]``; every ``norm.weight`` but the linear attention's gated norm gets ``+ 1``;
- Qwen3-Next's ``in_proj_qkvz`` (interleaved per key head) is split into ``attn_qkv`` (``[q | k
  | v]`` over all heads) and ``attn_gate`` (z); earlier converters wrote it whole as ``ssm_in``
  (``legacy_ssm_in``).

The experts' ``gate_up_proj`` is written as ``ffn_gate_exps`` and ``ffn_up_exps`` (the shared
helper :func:`tallow.plugin.testing.gguf_files.gguf_tensors`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tallow.plugin.testing.gguf_files import gguf_metadata, gguf_tensors


def tile_v_heads(t: torch.Tensor, dim: int, key_heads: int, head: int) -> torch.Tensor:
    """Heads of size ``head`` along ``dim`` from grouped ``[key heads, per key head]`` to tiled
    ``[per key head, key heads]`` order (llama.cpp's ``_reorder_v_heads``)."""
    shape = list(t.shape)
    per_key = shape[dim] // (key_heads * head)
    grouped = shape[:dim] + [key_heads, per_key, head] + shape[dim + 1 :]
    return t.reshape(grouped).transpose(dim, dim + 1).reshape(shape)


def _tile_linear_attention(name: str, t: torch.Tensor, cfg: Any) -> torch.Tensor:
    hk = cfg.linear_num_key_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    qk = 2 * hk * dk
    if ".in_proj_qkv." in name:
        return torch.cat([t[:qk], tile_v_heads(t[qk:], 0, hk, dv)])
    if ".in_proj_z." in name:
        return tile_v_heads(t, 0, hk, dv)
    if ".in_proj_b." in name or ".in_proj_a." in name:
        return tile_v_heads(t, 0, hk, 1)
    if name.endswith((".A_log", ".dt_bias")):
        return tile_v_heads(t, 0, hk, 1)
    if ".conv1d." in name:
        t = t.squeeze()
        return torch.cat([t[:qk], tile_v_heads(t[qk:], 0, hk, dv)])
    if ".out_proj." in name:
        return tile_v_heads(t, 1, hk, dv)
    return t


def converted_state(hf: Any, arch: str, *, legacy_ssm_in: bool = False) -> dict[str, torch.Tensor]:
    """``hf``'s state dict with llama.cpp's changes (see the module docstring), under the HF
    names the ``gguf`` map turns into the converter's tensor names."""
    cfg = hf.config
    tiled = arch in ("qwen35", "qwen35moe") and (
        cfg.linear_num_key_heads != cfg.linear_num_value_heads
    )
    out: dict[str, torch.Tensor] = {}
    for name, t in hf.state_dict().items():
        t = t.detach().float()
        if tiled and "linear_attn." in name:
            t = _tile_linear_attention(name, t, cfg)
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        elif name.endswith(".dt_bias"):
            name = name[: -len(".dt_bias")] + ".dt_proj.bias"
        elif "conv1d" in name:
            t = t.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + 1
        if name.endswith("in_proj_qkvz.weight") and not legacy_ssm_in:
            hk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
            per_key = cfg.linear_num_value_heads // hk * cfg.linear_value_head_dim
            q, k, v, z = t.reshape(hk, -1, t.shape[-1]).split([dk, dk, per_key, per_key], dim=1)
            flat = [p.reshape(-1, t.shape[-1]) for p in (q, k, v, z)]
            base = name[: -len("in_proj_qkvz.weight")]
            out[base + "in_proj_qkv.weight"] = torch.cat(flat[:3])
            out[base + "in_proj_z.weight"] = flat[3]
            continue
        out[name] = t
    return out


def hybrid_metadata(cfg: Any, arch: str, **extra: Any) -> dict[str, Any]:
    """The architecture keys the converter writes for ``cfg`` (None values left out)."""
    types = list(cfg.layer_types)
    interval = types.index("full_attention") + 1
    assert types == [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(len(types))
    ], "a GGUF file states the layer pattern as one interval"
    keys: dict[str, Any] = {
        "ssm.conv_kernel": cfg.linear_conv_kernel_dim,
        "ssm.state_size": cfg.linear_key_head_dim,
        "ssm.group_count": cfg.linear_num_key_heads,
        "ssm.time_step_rank": cfg.linear_num_value_heads,
        "ssm.inner_size": cfg.linear_value_head_dim * cfg.linear_num_value_heads,
        "full_attention_interval": interval,
    }
    if getattr(cfg, "num_experts", None):
        keys.update(
            expert_count=cfg.num_experts,
            expert_used_count=cfg.num_experts_per_tok,
            expert_feed_forward_length=cfg.moe_intermediate_size,
            expert_shared_feed_forward_length=cfg.shared_expert_intermediate_size,
        )
    metadata = gguf_metadata(cfg, **keys, **extra)
    return {k: v for k, v in metadata.items() if v is not None}


def hybrid_gguf_tensors(
    hf: Any, arch: str, *, legacy_ssm_in: bool = False
) -> list[tuple[str, np.ndarray]]:
    """``(gguf name, float32 array)`` of every tensor the converter writes for ``hf``."""
    state = converted_state(hf, arch, legacy_ssm_in=legacy_ssm_in)
    return list(gguf_tensors(state, arch, hf.config.num_hidden_layers))
