"""tallow-model-olmo2: OLMo 2 (``Olmo2ForCausalLM``) for tallow.

The model code lives in :mod:`tallow_model_olmo2.model`; importing this package imports no torch.
"""

__version__ = "0.1.0"
