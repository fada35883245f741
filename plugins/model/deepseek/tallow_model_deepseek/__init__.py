"""tallow-model-deepseek: DeepSeek-V2 and DeepSeek-V3 (multi-head latent attention and a
mixture of experts with shared experts) for tallow.

The model code lives in :mod:`tallow_model_deepseek.model`; importing this package imports no
torch.
"""

__version__ = "0.1.0"
