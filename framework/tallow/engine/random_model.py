"""``random:<shape>`` models: real architectures and shapes, random weights made on the device.

Speed does not depend on weight values, so benchmarks and GPU parity tests use these instead of
multi-gigabyte downloads. The vocabulary is synthetic (token ``i`` reads ``<i>``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterator

import torch

from tallow.plugin import Checkpoint, WeightFormat

_LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

_GPT_OSS_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
# gpt-oss's published quantization: MXFP4 experts, everything else in bfloat16
_MXFP4 = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}

# Qwen3-Next-80B-A3B's layers (without the layer count), as its config.json gives them
_QWEN3_NEXT: dict[str, Any] = dict(
    architectures=["Qwen3NextForCausalLM"],
    hidden_size=2048,
    intermediate_size=5120,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    full_attention_interval=4,
    num_experts=512,
    num_experts_per_tok=10,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    vocab_size=151936,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
    },
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)

_QWEN25_VL_VISION = dict(
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    in_channels=3,
    out_hidden_size=3584,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
    tokens_per_second=2,
    hidden_act="silu",
)

SHAPES: dict[str, dict[str, Any]] = {
    "llama-3-8b": dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    # 141 GB of bf16 weights: more than one GPU holds, so served with tensor parallelism
    "llama-3-70b": dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_scaling=_LLAMA3,
        tie_word_embeddings=False,
    ),
    "llama-3.2-1b": dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_scaling={**_LLAMA3, "factor": 32.0},
    ),
    "mistral-7b": dict(
        architectures=["MistralForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32768,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": dict(
        architectures=["Qwen2ForCausalLM"],
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "qwen3-0.6b": dict(
        architectures=["Qwen3ForCausalLM"],
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": dict(
        architectures=["Qwen3ForCausalLM"],
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    # 128 experts of which 8 per token: 30.5B parameters, 3.3B active per token
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"],
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    # 8 experts of 14336 of which 2 per token, in every layer: 46.7B parameters, 12.9B active
    "mixtral-8x7b": dict(
        architectures=["MixtralForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
    # gpt-oss-20b: 32 experts of 2880 of which 4 per token, stored as MXFP4 (as published;
    # held packed by the fp4 quant scheme of tallow-quant-fp4): 20.9B parameters, 3.6B active
    # per token; every other layer a 128-token window, attention sinks, YaRN
    "gpt-oss-20b": dict(
        architectures=["GptOssForCausalLM"],
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=24,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=32,
        num_experts_per_tok=4,
        vocab_size=201088,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 12,
        attention_bias=True,
        swiglu_limit=7.0,
        rope_theta=150000.0,
        rope_scaling=_GPT_OSS_YARN,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        quantization_config=_MXFP4,
    ),
    # Qwen3-Next-80B-A3B: 48 layers, every 4th gated full attention, the others Gated
    # DeltaNet (a recurrent state per sequence); 512 experts of which 10 per token and a gated
    # shared expert: 80B parameters, 3B active per token (160 GB in bf16: more than one GPU)
    "qwen3-next-80b-a3b": dict(_QWEN3_NEXT, num_hidden_layers=48),
    # the same layers, 12 of them (3 full attention, 9 linear; 20B parameters): one GPU holds
    # it in bf16, for benchmarks per layer against "qwen3-next-12l-attn"
    "qwen3-next-12l": dict(_QWEN3_NEXT, num_hidden_layers=12),
    # "qwen3-next-12l" with every layer gated full attention: the attention-only counterpart
    "qwen3-next-12l-attn": dict(
        _QWEN3_NEXT, num_hidden_layers=12, layer_types=["full_attention"] * 12
    ),
    # Qwen3.5-35B-A3B's text model as transformers 5 documents it (Qwen3_5MoeTextConfig's
    # defaults): 40 layers, every 4th gated full attention, 256 experts of 512 with 8 per
    # token and a gated shared expert: about 35B parameters, 70 GB in bf16
    "qwen3.5-35b-a3b": dict(
        _QWEN3_NEXT,
        architectures=["Qwen3_5MoeForCausalLM"],
        num_hidden_layers=40,
        num_experts=256,
        num_experts_per_tok=8,
        vocab_size=248320,
        max_position_embeddings=32768,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    ),
    # Qwen2.5-VL-7B-Instruct: the Qwen2.5-7B text model with M-RoPE and a 32-block window-
    # attention vision tower (675M parameters) whose merger projects to the text width
    "qwen2.5-vl-7b": dict(
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [16, 24, 24],
        },
        max_position_embeddings=128000,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
        vision_config=_QWEN25_VL_VISION,
    ),
    # the same families' few-MB twin, for CPU runs of the image path
    "tiny-qwen2.5-vl": dict(
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        image_token_id=500,
        vision_start_token_id=501,
        vision_end_token_id=502,
        vision_config=dict(
            _QWEN25_VL_VISION,
            depth=2,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            out_hidden_size=64,
            fullatt_block_indexes=[1],
        ),
    ),
    # A few-MB Qwen3-Next (linear, linear, full, linear; 8 experts, 2 per token), for CPU tests
    # of the recurrent-state path in the engine.
    "tiny-qwen3-next": dict(
        architectures=["Qwen3NextForCausalLM"],
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        vocab_size=512,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    # sentence-transformers/all-MiniLM-L6-v2 (an encoder: served for embeddings)
    "all-minilm-l6-v2": dict(
        architectures=["BertModel"],
        hidden_size=384,
        intermediate_size=1536,
        num_hidden_layers=6,
        num_attention_heads=12,
        vocab_size=30522,
        max_position_embeddings=512,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        hidden_act="gelu",
    ),
    # Gemma 3 4B's text model: every 6th layer global, the others a 1024-token window
    "gemma-3-4b": dict(
        architectures=["Gemma3ForCausalLM"],
        hidden_size=2560,
        intermediate_size=10240,
        num_hidden_layers=34,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        vocab_size=262208,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=256,
        sliding_window=1024,
        sliding_window_pattern=6,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # Gemma 4 E2B's text model: 4 sliding layers (512 tokens) then a full one, full layers
    # 512-wide heads; per-layer inputs; the last 20 layers read the K/V of layers 13 and 14
    # and have double-width MLPs
    "gemma-4-e2b": dict(
        architectures=["Gemma4ForCausalLM"],
        hidden_size=1536,
        intermediate_size=6144,
        num_hidden_layers=35,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        global_head_dim=512,
        vocab_size=262144,
        vocab_size_per_layer_input=262144,
        hidden_size_per_layer_input=256,
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=512,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
        num_kv_shared_layers=20,
        use_double_wide_mlp=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
            },
        },
        final_logit_softcapping=30.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # Gemma 4 26B-A4B's text model: 128 GeGLU experts (8 per token) beside a dense MLP in
    # every layer, full layers with K=V attention over 2 KV heads of 512, no per-layer inputs
    "gemma-4-26b-a4b": dict(
        architectures=["Gemma4ForCausalLM"],
        hidden_size=2816,
        intermediate_size=2112,
        moe_intermediate_size=704,
        num_experts=128,
        top_k_experts=8,
        enable_moe_block=True,
        num_hidden_layers=30,
        num_attention_heads=16,
        num_key_value_heads=8,
        num_global_key_value_heads=2,
        attention_k_eq_v=True,
        head_dim=256,
        global_head_dim=512,
        vocab_size=262144,
        hidden_size_per_layer_input=0,
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=1024,
        final_logit_softcapping=30.0,
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # A few-MB Mistral: every layer a 24-token sliding window, so CPU tests cross it.
    "tiny-mistral": dict(
        architectures=["MistralForCausalLM"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        sliding_window=24,
        tie_word_embeddings=False,
    ),
    # A few-MB model of the llama shape family, for CPU tests of the random path itself.
    "tiny-llama": dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    # A few-MB Qwen3-MoE (8 experts, 2 per token), for CPU tests of MoE models in the engine.
    "tiny-qwen3-moe": dict(
        architectures=["Qwen3MoeForCausalLM"],
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        vocab_size=512,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    # deepseek-ai/DeepSeek-V2-Lite: latent attention (kv_lora_rank 512 + 64 rope dims cached
    # per token), 64 routed experts (6 per token) and 2 shared ones from layer 1 on, YaRN x40
    "deepseek-v2-lite": dict(
        architectures=["DeepseekV2ForCausalLM"],
        hidden_size=2048,
        intermediate_size=10944,
        moe_intermediate_size=1408,
        num_hidden_layers=27,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=64,
        n_shared_experts=2,
        num_experts_per_tok=6,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
        norm_topk_prob=False,
        vocab_size=102400,
        rope_theta=10000.0,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
        max_position_embeddings=163840,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    # zai-org/GLM-4.7-Flash: DeepSeek-V3's latent attention (20 heads, kv_lora_rank 512 + 64
    # rope dims cached per token, q_lora_rank 768, 192 + 64 query/key and 256 value dims per
    # head), 64 routed experts of 1536 (4 per token, sigmoid) and a shared one from layer 1 on
    "glm-4.7-flash": dict(
        architectures=["Glm4MoeLiteForCausalLM"],
        hidden_size=2048,
        intermediate_size=10240,
        moe_intermediate_size=1536,
        num_hidden_layers=47,
        num_attention_heads=20,
        num_key_value_heads=20,
        q_lora_rank=768,
        kv_lora_rank=512,
        qk_nope_head_dim=192,
        qk_rope_head_dim=64,
        v_head_dim=256,
        n_routed_experts=64,
        n_shared_experts=1,
        num_experts_per_tok=4,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.8,
        norm_topk_prob=True,
        vocab_size=154880,
        rope_theta=1000000.0,
        rope_interleave=True,
        max_position_embeddings=202752,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    # A few-MB DeepSeek-V3 (latent attention with a low-rank query, 8 experts in 4 groups,
    # sigmoid routing with a correction bias, a shared expert, a dense first layer).
    "tiny-deepseek-v3": dict(
        architectures=["DeepseekV3ForCausalLM"],
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        vocab_size=512,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    # A few-MB Mixtral (8 experts, 2 per token, a 24-token window), for CPU tests in the engine.
    "tiny-mixtral": dict(
        architectures=["MixtralForCausalLM"],
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=512,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        sliding_window=24,
        tie_word_embeddings=False,
    ),
    # A few-MB gpt-oss (8 experts, 4 per token, MXFP4 like the real one; a 24-token window on
    # every other layer, sinks, YaRN over an original context of 256), for CPU engine tests.
    "tiny-gpt-oss": dict(
        architectures=["GptOssForCausalLM"],
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=4,
        vocab_size=512,
        sliding_window=24,
        layer_types=["sliding_attention", "full_attention"],
        attention_bias=True,
        swiglu_limit=7.0,
        rope_theta=150000.0,
        rope_scaling={**_GPT_OSS_YARN, "factor": 8.0, "original_max_position_embeddings": 256},
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        quantization_config=_MXFP4,
    ),
}


def shape_config(source: str) -> dict[str, Any]:
    name = source[len("random:") :] if source.startswith("random:") else source
    if name not in SHAPES:
        raise ValueError(
            f"model.source: unknown random shape {name!r}; expected "
            f"random:<shape> with shape one of {', '.join(sorted(SHAPES))}"
        )
    config = {
        "model_type": "random",
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "bfloat16",
        **SHAPES[name],
    }
    return config


def synthetic_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


#: standard deviation of the random matrices
RANDOM_STD = 0.02


@torch.no_grad()
def initialize_random(model: torch.nn.Module, seed: int = 0, progress: str | None = None) -> None:
    """Fill every parameter on its own device: matrices ~ N(0, 0.02), norms 1, biases 0.

    A parameter that carries ``random_fill(generator, std)`` (a quantization method whose
    storage is made from float weights, e.g. while quantizing at load) fills itself: it draws
    its float weights, one layer at a time, so no float copy of the whole model exists.
    ``progress`` titles a progress bar over the parameters (shown on a terminal only)."""
    from tqdm.auto import tqdm

    gen = None
    params = list(model.named_parameters())
    for name, param in tqdm(
        params,
        desc=progress,
        unit="tensor",
        leave=False,
        disable=True if progress is None else None,
    ):
        if gen is None or gen.device != param.device:
            gen = torch.Generator(device=param.device).manual_seed(seed)
        fill = getattr(param, "random_fill", None)
        if fill is not None:
            fill(gen, RANDOM_STD)
        elif name.endswith("bias"):
            param.zero_()
        elif param.dim() == 1:
            param.fill_(1.0)
        elif param.is_floating_point():
            param.normal_(0.0, RANDOM_STD, generator=gen)


class RandomWeights(WeightFormat):
    name: ClassVar[str] = "random"

    @classmethod
    def claims(cls, source: str) -> bool:
        return isinstance(source, str) and source.startswith("random:")

    def load(self, source: str, *, revision: str | None = None) -> Checkpoint:
        config = shape_config(source)

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            return iter(())

        quantization = config.get("quantization_config")
        return Checkpoint(
            source=source,
            config=config,
            architecture=config["architectures"][0],
            # a shape whose real checkpoints are quantized is built with their quant scheme
            quantization=quantization.get("quant_method") if quantization else None,
            tensors=tensors,
            naming="random",
            tokenizer=synthetic_tokenizer(config["vocab_size"]),
            tokenizer_config={"eos_token": "<0>", "add_bos_token": False},
        )
