"""tallow-model-minimax-m2: MiniMax M2 (a sigmoid-routed mixture of experts in every layer)
for tallow.

The model code lives in :mod:`tallow_model_minimax_m2.model`; importing this package imports
no torch.
"""

__version__ = "0.1.0"
