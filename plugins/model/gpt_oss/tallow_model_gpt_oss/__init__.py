"""tallow-model-gpt-oss: gpt-oss for tallow, on :class:`tallow.layers.FusedMoE` with attention
sinks.

The model code lives in :mod:`tallow_model_gpt_oss.model`; importing this package imports no
torch.
"""

__version__ = "0.1.0"
