"""tallow-model-llama: the Llama family (Llama 2/3/3.1/3.2, Mistral, Qwen2, Qwen3) for tallow.

The model code lives in :mod:`tallow_model_llama.model`; importing this package imports no torch.
"""

__version__ = "0.1.0"
