"""The tiny GLM-4.5 MoE configuration and prompt shared by this plugin's tests."""

CONFIG = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=128,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=1.5,
    norm_topk_prob=True,
    attention_bias=True,
    use_qk_norm=True,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [(29 * i + 5) % 128 for i in range(24)]
