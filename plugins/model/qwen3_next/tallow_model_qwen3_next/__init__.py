"""tallow-model-qwen3-next: Qwen3-Next for tallow, its linear-attention layers on the engine's
recurrent-state cache.

The model code lives in :mod:`tallow_model_qwen3_next.model`; importing this package imports
no torch.
"""

__version__ = "0.1.0"
