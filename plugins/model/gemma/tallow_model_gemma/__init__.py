"""tallow-model-gemma: Gemma 2, Gemma 3 (with images too) and Gemma 4 (text) for tallow.

The model code lives in :mod:`tallow_model_gemma.model` (Gemma 4:
:mod:`tallow_model_gemma.gemma4`); importing this package imports no torch.
"""

__version__ = "0.1.0"
