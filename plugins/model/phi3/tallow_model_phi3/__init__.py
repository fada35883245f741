"""tallow-model-phi3: Phi-3, Phi-3.5 and Phi-4 (``Phi3ForCausalLM``) for tallow.

The model code lives in :mod:`tallow_model_phi3.model`; importing this package imports no torch.
"""

__version__ = "0.1.0"
