"""Public building blocks for model plugins."""

from .activation import GeluTanhAndMul, SiluAndMul, get_act_and_mul
from .attention import (
    Attention, AttentionLayer, AttentionMetadata, ForwardContext, forward_context,
    get_forward_context,
)
from .causal_lm import CausalLM, default_weight_loader
from .embedding import LMHead, VocabEmbedding
from .linear import (
    ColumnParallelLinear, LinearBase, MergedColumnParallelLinear, QKVParallelLinear,
    ReplicatedLinear, RowParallelLinear, WeightSlice,
)
from .linear_method import (
    LinearMethod, UnquantizedLinearMethod, linear_method_for, set_weight_attrs,
)
from .model import ArchConfig, BuildContext
from .packed_linear import PackedLinearMethod
from .norm import RMSNorm, rms_norm_ref
from .quantized import QuantizedWeight
from .rotary import (
    SUPPORTED_ROPE_TYPES, DynamicNTKRotaryEmbedding, RotaryEmbedding, apply_rotary,
    compute_inv_freq, get_rope, rope_parameters,
)
from .weight_names import WeightLoadError, WeightMatch, WeightNameMap, WeightRule

__all__ = [
    "Attention", "AttentionLayer", "AttentionMetadata", "ForwardContext", "forward_context",
    "get_forward_context", "ArchConfig", "BuildContext",
    "CausalLM", "default_weight_loader",
    "LinearBase", "ReplicatedLinear", "ColumnParallelLinear", "MergedColumnParallelLinear",
    "QKVParallelLinear", "RowParallelLinear", "WeightSlice", "QuantizedWeight",
    "LinearMethod", "UnquantizedLinearMethod", "linear_method_for", "set_weight_attrs",
    "PackedLinearMethod",
    "RMSNorm", "rms_norm_ref", "SiluAndMul", "GeluTanhAndMul", "get_act_and_mul",
    "VocabEmbedding", "LMHead",
    "RotaryEmbedding", "DynamicNTKRotaryEmbedding", "get_rope", "apply_rotary",
    "compute_inv_freq", "rope_parameters", "SUPPORTED_ROPE_TYPES",
    "WeightRule", "WeightNameMap", "WeightMatch", "WeightLoadError",
]
