"""tallow-attention-triton: the "triton" paged-attention backend of tallow.

Importing this package imports neither torch nor triton; the backend class
(:class:`tallow_attention_triton.backend.TritonAttentionBackend`) and the kernel launchers
(:mod:`tallow_attention_triton.ops`) are loaded when the engine selects the backend.
"""

__version__ = "0.1.0"
