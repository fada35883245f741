"""tallow-model-gemma: Gemma 2 and Gemma 3 (Gemma 3 with images too) for tallow.

The model code lives in :mod:`tallow_model_gemma.model`; importing this package imports no torch.
"""

__version__ = "0.1.0"
