"""tallow-model-qwen-moe: Qwen2-MoE and Qwen3-MoE for tallow, on :class:`tallow.layers.FusedMoE`.

The model code lives in :mod:`tallow_model_qwen_moe.model`; importing this package imports no
torch.
"""

__version__ = "0.1.0"
