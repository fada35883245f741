"""tallow-model-glm4: GLM-4 (the 0414 family, ``Glm4ForCausalLM``) for tallow.

The model code lives in :mod:`tallow_model_glm4.model`; importing this package imports no torch.
"""

__version__ = "0.1.0"
