"""tallow-attention-flashinfer: the "flashinfer" paged-attention backend of tallow.

Importing this package imports neither torch nor flashinfer; the backend class
(:class:`tallow_attention_flashinfer.backend.FlashInferAttentionBackend`) is loaded when the
engine considers the backend.
"""

__version__ = "0.1.0"
