"""How checkpoint tensor names map onto the parameters of the Llama-family models.

Parameters of the tallow model (one decoder layer ``i``)::

    model.embed_tokens.weight                      [vocab, hidden]
    model.layers.i.input_layernorm.weight          [hidden]
    model.layers.i.self_attn.qkv_proj.weight       [(Hq + 2 Hkv) * D, hidden]   shards q, k, v
    model.layers.i.self_attn.qkv_proj.bias         (Qwen2, or attention_bias)  shards q, k, v
    model.layers.i.self_attn.q_norm.weight         [D]   (Qwen3)
    model.layers.i.self_attn.k_norm.weight         [D]   (Qwen3)
    model.layers.i.self_attn.o_proj.weight         [hidden, Hq * D]
    model.layers.i.post_attention_layernorm.weight [hidden]
    model.layers.i.mlp.gate_up_proj.weight         [2 * intermediate, hidden]  shards 0 (gate), 1 (up)
    model.layers.i.mlp.down_proj.weight            [hidden, intermediate]
    model.norm.weight                              [hidden]
    lm_head.weight                                 [vocab, hidden]  (shared with the embedding when tied)

Hugging Face names (``naming="hf"``) → parameter:

    model.embed_tokens.weight                → model.embed_tokens.weight
    model.layers.i.self_attn.{q,k,v}_proj.*  → model.layers.i.self_attn.qkv_proj.*  (shard q/k/v)
    model.layers.i.self_attn.o_proj.*        → same name
    model.layers.i.self_attn.{q,k}_norm.weight → same name
    model.layers.i.mlp.{gate,up}_proj.*      → model.layers.i.mlp.gate_up_proj.*  (shard 0/1)
    model.layers.i.mlp.down_proj.*           → same name
    model.layers.i.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight
                                             → same name
    already fused qkv_proj / gate_up_proj    → same name (split on load)
    model.layers.i.self_attn.rotary_emb.inv_freq → ignored (recomputed)
    model.layers.i.self_attn.{k,v}_scale     → the layer's KV-cache scales (FP8-KV checkpoints;
                                               CausalLM.load_{k,v}_cache_scale)

GGUF names (``naming="gguf"``; matrices ``[out, in]``, float or still block-quantized) → parameter:

    token_embd.weight            → model.embed_tokens.weight
    blk.i.attn_norm.weight       → model.layers.i.input_layernorm.weight
    blk.i.attn_q.{weight,bias}   → model.layers.i.self_attn.qkv_proj.*  shard q   (*)
    blk.i.attn_k.{weight,bias}   → model.layers.i.self_attn.qkv_proj.*  shard k   (*)
    blk.i.attn_v.{weight,bias}   → model.layers.i.self_attn.qkv_proj.*  shard v
    blk.i.attn_qkv.{weight,bias} → model.layers.i.self_attn.qkv_proj.*  (already fused: Phi-3)
    blk.i.attn_output.weight     → model.layers.i.self_attn.o_proj.weight
    blk.i.attn_q_norm.weight     → model.layers.i.self_attn.q_norm.weight
    blk.i.attn_k_norm.weight     → model.layers.i.self_attn.k_norm.weight
    blk.i.ffn_norm.weight        → model.layers.i.post_attention_layernorm.weight
    blk.i.ffn_gate.weight        → model.layers.i.mlp.gate_up_proj.weight  shard 0
    blk.i.ffn_up.weight          → model.layers.i.mlp.gate_up_proj.weight  shard 1
                                   (whole, gate|up, with ``fused_gate_up``: Phi-3, GLM-4)
    blk.i.ffn_down.weight        → model.layers.i.mlp.down_proj.weight
    output_norm.weight           → model.norm.weight
    output.weight                → lm_head.weight  (absent: the head is tied to token_embd)
    rope_freqs.weight            → per-frequency RoPE divisors (Llama 3.1+ scaling)

(*) For GGUF architecture ``llama`` the converter stores the rows of each Q and K head
interleaved (pairs ``(x_j, x_{j+D/2})`` side by side, the rotary layout of the original Llama
code); loading undoes it: rows ``[heads, D/2, 2]`` → ``[heads, 2, D/2]``, with the KV head count for
K. ``qwen2`` and ``qwen3`` files keep the Hugging Face layout. The permutation moves whole rows,
so it applies to the rows of a tensor that is still block-quantized as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tallow.layers import WeightNameMap, WeightRule

if TYPE_CHECKING:  # pragma: no cover
    import torch

_L = "model.layers.{i}"
_B = "blk.{i}"


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names."""
    return WeightNameMap(
        [
            WeightRule("model.embed_tokens.weight", "model.embed_tokens.weight"),
            WeightRule(f"{_L}.self_attn.q_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="q"),
            WeightRule(f"{_L}.self_attn.k_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="k"),
            WeightRule(f"{_L}.self_attn.v_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="v"),
            WeightRule(f"{_L}.self_attn.qkv_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}"),
            WeightRule(f"{_L}.self_attn.o_proj.{{p}}", f"{_L}.self_attn.o_proj.{{p}}"),
            WeightRule(f"{_L}.self_attn.q_norm.weight", f"{_L}.self_attn.q_norm.weight"),
            WeightRule(f"{_L}.self_attn.k_norm.weight", f"{_L}.self_attn.k_norm.weight"),
            WeightRule(f"{_L}.self_attn.rotary_emb.inv_freq"),
            WeightRule(f"{_L}.self_attn.k_scale", handler="load_k_cache_scale"),
            WeightRule(f"{_L}.self_attn.v_scale", handler="load_v_cache_scale"),
            WeightRule(f"{_L}.mlp.gate_proj.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=0),
            WeightRule(f"{_L}.mlp.up_proj.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=1),
            WeightRule(f"{_L}.mlp.gate_up_proj.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}"),
            WeightRule(f"{_L}.mlp.down_proj.{{p}}", f"{_L}.mlp.down_proj.{{p}}"),
            WeightRule(f"{_L}.input_layernorm.weight", f"{_L}.input_layernorm.weight"),
            WeightRule(
                f"{_L}.post_attention_layernorm.weight", f"{_L}.post_attention_layernorm.weight"
            ),
            WeightRule("model.norm.weight", "model.norm.weight"),
            WeightRule("lm_head.{p}", "lm_head.{p}"),  # weight, or a quantized head's tensors
        ]
    )


def gguf_name_map(interleaved_qk: bool, fused_gate_up: bool = False) -> WeightNameMap:
    """llama.cpp GGUF names; ``interleaved_qk`` for files whose Q/K rows need un-permuting,
    ``fused_gate_up`` for families whose ``ffn_up`` holds gate and up together (Phi-3, GLM-4).
    Families with more tensors append their rules (``gguf_name_map(...) + [...]``)."""
    q_fix = "unpermute_q" if interleaved_qk else None
    k_fix = "unpermute_k" if interleaved_qk else None
    up = (
        WeightRule(f"{_B}.ffn_up.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}")
        if fused_gate_up
        else WeightRule(f"{_B}.ffn_up.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=1)
    )
    return WeightNameMap(
        [
            WeightRule("token_embd.weight", "model.embed_tokens.weight"),
            WeightRule(f"{_B}.attn_norm.weight", f"{_L}.input_layernorm.weight"),
            WeightRule(
                f"{_B}.attn_q.{{p}}",
                f"{_L}.self_attn.qkv_proj.{{p}}",
                shard="q",
                transform=q_fix,
                rowwise=True,
            ),
            WeightRule(
                f"{_B}.attn_k.{{p}}",
                f"{_L}.self_attn.qkv_proj.{{p}}",
                shard="k",
                transform=k_fix,
                rowwise=True,
            ),
            WeightRule(f"{_B}.attn_v.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="v"),
            WeightRule(f"{_B}.attn_qkv.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}"),
            WeightRule(f"{_B}.attn_output.{{p}}", f"{_L}.self_attn.o_proj.{{p}}"),
            WeightRule(f"{_B}.attn_q_norm.weight", f"{_L}.self_attn.q_norm.weight"),
            WeightRule(f"{_B}.attn_k_norm.weight", f"{_L}.self_attn.k_norm.weight"),
            WeightRule(f"{_B}.ffn_norm.weight", f"{_L}.post_attention_layernorm.weight"),
            WeightRule(f"{_B}.ffn_gate.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=0),
            up,
            WeightRule(f"{_B}.ffn_down.{{p}}", f"{_L}.mlp.down_proj.{{p}}"),
            WeightRule("output_norm.weight", "model.norm.weight"),
            WeightRule("output.weight", "lm_head.weight"),
            WeightRule("rope_freqs.weight", handler="load_rope_freqs"),
        ]
    )


def unpermute_rows(w: "torch.Tensor", n_head: int) -> "torch.Tensor":
    """Undo llama.cpp's Q/K row interleaving of a ``[n_head * D, ...]`` tensor (see above)."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot un-permute {rows} rows into {n_head} heads of even size")
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
