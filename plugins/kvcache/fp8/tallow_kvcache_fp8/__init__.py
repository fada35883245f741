"""tallow-kvcache-fp8: K and V cached as 8-bit floats (``cache.kv_codec: fp8`` or ``fp8_e5m2``).

The registration module is :mod:`tallow_kvcache_fp8.plugin`, the codecs live in
:mod:`tallow_kvcache_fp8.codec`.
"""

__version__ = "0.1.0"
