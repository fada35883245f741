"""tallow-model-granite: IBM Granite 3 (``GraniteForCausalLM``) for tallow.

The model code lives in :mod:`tallow_model_granite.model`; importing this package imports no torch.
"""

__version__ = "0.1.0"
