"""The tiny Qwen3-Next config of the plugin's tests."""

from __future__ import annotations

# Two linear-attention layers, then full attention, then linear again; layer 2 is dense
# (mlp_only_layers): every kind of block of the architecture.
TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    mlp_only_layers=[2],
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

# head sizes the GPU kernels tile as they do Qwen3-Next's (64 and 128 features)
GPU_CONFIG = dict(
    hidden_size=128,
    intermediate_size=192,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=160,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# past two chunks of the delta rule (64 tokens each)
LONG_PROMPT = [(37 * i + 11) % 160 for i in range(150)]
