"""tallow-model-mixtral: Mixtral for tallow, on :class:`tallow.layers.FusedMoE`.

The model code lives in :mod:`tallow_model_mixtral.model`; importing this package imports no
torch.
"""

__version__ = "0.1.0"
