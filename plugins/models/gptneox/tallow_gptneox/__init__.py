"""tallow-model-gptneox: GPT-NeoX-family models (GPT-NeoX-20B, Pythia) for tallow.

The model code lives in :mod:`tallow_gptneox.model`; importing this package imports no torch.
"""

__version__ = "0.1.0"
