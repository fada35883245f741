"""tallow-model-glm4-moe: GLM-4.5 / GLM-4.6 / GLM-4.7 mixture-of-experts models for tallow.

The model code lives in :mod:`tallow_model_glm4_moe.model`; importing this package imports no
torch.
"""

__version__ = "0.1.0"
