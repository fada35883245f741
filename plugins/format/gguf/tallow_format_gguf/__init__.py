"""tallow-format-gguf: GGUF model files (single or split) as a tallow weight format.

The registration module is :mod:`tallow_format_gguf.plugin`; the loader is
:class:`tallow_format_gguf.format.GGUFFormat`. Importing this package imports neither torch nor gguf.
"""

__version__ = "0.1.0"
