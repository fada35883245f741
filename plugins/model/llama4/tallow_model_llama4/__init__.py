"""tallow-model-llama4: Llama 4 (text) for tallow, on tallow-llama's decoder and
:class:`tallow.layers.FusedMoE`.

The model code lives in :mod:`tallow_model_llama4.model`; importing this package imports no
torch.
"""

__version__ = "0.1.0"
