"""tallow-model-gptneox: GPT-NeoX-family models (GPT-NeoX-20B, Pythia, StableLM) for tallow.

The model code lives in :mod:`tallow_model_gptneox.model` (GPT-NeoX) and
:mod:`tallow_model_gptneox.stablelm`; importing this package imports no torch.
"""

__version__ = "0.1.0"
