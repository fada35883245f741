"""tallow-format-hfhub: Hugging Face hub ids ("org/name") as a tallow weight format.

Importing this package imports no torch.
"""

__version__ = "0.1.0"
