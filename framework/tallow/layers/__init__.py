"""Public building blocks for model plugins."""

from .activation import GeluTanhAndMul, SiluAndMul, get_act_and_mul
from .attention import (
    Attention,
    AttentionLayer,
    AttentionMetadata,
    ForwardContext,
    SharedKVAttention,
    forward_context,
    get_forward_context,
    shared_kv_layers,
)
from .cache_spec import (
    CacheLayer,
    CacheSpec,
    FullAttentionSpec,
    LatentCacheSpec,
    RecurrentStateSpec,
    SlidingWindowSpec,
    StateCache,
    StateTensorSpec,
    cache_layers,
)
from .causal_lm import CausalLM, default_weight_loader
from .mtp import MTPHead
from .embedding import LMHead, VocabEmbedding
from .encoder import EncoderModel
from .layer_norm import LayerNorm
from .linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    WeightSlice,
)
from .linear_method import (
    LinearMethod,
    UnquantizedLinearMethod,
    linear_method_for,
    set_weight_attrs,
)
from .model import ArchConfig, BuildContext
from .multimodal import (
    MultimodalStep,
    PlacedImage,
    ProcessedImage,
    VisionLanguageModel,
    current_multimodal_step,
    merge_multimodal_embeddings,
    multimodal_step,
)
from .mla import MLAAttention, MLALayer
from .mrope import MRotaryEmbedding, mrope_section
from .fused_moe import FusedExperts, FusedMoE
from .moe_method import MoEMethod, UnquantizedMoEMethod, moe_method_for
from .moe_router import SCORINGS, RouterSpec, select_experts
from .packed_linear import PackedLinearMethod
from .norm import RMSNorm, rms_norm_ref
from .plain_activation import PLAIN_ACTIVATIONS, Activation, get_act
from .pooling import POOLING_MODES, Pooler, pool_hidden
from .quantized import QuantizedWeight
from .rope_config import rope_from_config, rotary_dim
from .rotary import (
    SUPPORTED_ROPE_TYPES,
    DynamicNTKRotaryEmbedding,
    RotaryEmbedding,
    apply_rotary,
    compute_inv_freq,
    get_rope,
    rope_parameters,
)
from .weight_names import WeightLoadError, WeightMatch, WeightNameMap, WeightRule
from .context_length import context_lengths
from .rope_scaling import LongRoPERotaryEmbedding, longrope_attention_factor, longrope_rotary
from .sharded_norm import ShardedRMSNorm

__all__ = [
    "Attention",
    "AttentionLayer",
    "AttentionMetadata",
    "ForwardContext",
    "SharedKVAttention",
    "shared_kv_layers",
    "forward_context",
    "get_forward_context",
    "CacheLayer",
    "CacheSpec",
    "FullAttentionSpec",
    "LatentCacheSpec",
    "RecurrentStateSpec",
    "SlidingWindowSpec",
    "StateCache",
    "StateTensorSpec",
    "cache_layers",
    "ArchConfig",
    "BuildContext",
    "MLAAttention",
    "MLALayer",
    "CausalLM",
    "MTPHead",
    "default_weight_loader",
    "EncoderModel",
    "Pooler",
    "pool_hidden",
    "POOLING_MODES",
    "LinearBase",
    "ReplicatedLinear",
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "QKVParallelLinear",
    "RowParallelLinear",
    "WeightSlice",
    "QuantizedWeight",
    "LinearMethod",
    "UnquantizedLinearMethod",
    "linear_method_for",
    "set_weight_attrs",
    "PackedLinearMethod",
    "RMSNorm",
    "rms_norm_ref",
    "SiluAndMul",
    "GeluTanhAndMul",
    "get_act_and_mul",
    "VocabEmbedding",
    "LMHead",
    "RotaryEmbedding",
    "DynamicNTKRotaryEmbedding",
    "get_rope",
    "apply_rotary",
    "compute_inv_freq",
    "rope_parameters",
    "SUPPORTED_ROPE_TYPES",
    "WeightRule",
    "WeightNameMap",
    "WeightMatch",
    "WeightLoadError",
    "LayerNorm",
    "Activation",
    "get_act",
    "PLAIN_ACTIVATIONS",
    "rope_from_config",
    "rotary_dim",
    "context_lengths",
    "LongRoPERotaryEmbedding",
    "longrope_attention_factor",
    "longrope_rotary",
    "ShardedRMSNorm",
    "FusedMoE",
    "FusedExperts",
    "MoEMethod",
    "UnquantizedMoEMethod",
    "moe_method_for",
    "RouterSpec",
    "select_experts",
    "SCORINGS",
    "MultimodalStep",
    "PlacedImage",
    "ProcessedImage",
    "VisionLanguageModel",
    "current_multimodal_step",
    "merge_multimodal_embeddings",
    "multimodal_step",
    "MRotaryEmbedding",
    "mrope_section",
]
