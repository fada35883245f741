"""tallow-kvcache-turboquant: K and V rotated by a randomized Hadamard transform, then
quantized to 8, 4 or 3 bits with one scale per token and head (``cache.kv_codec: turbo8``,
``turbo4`` or ``turbo3``).

The registration module is :mod:`tallow_kvcache_turboquant.plugin`; the format is defined by
:mod:`~tallow_kvcache_turboquant.rotation` (the rotation), :mod:`~tallow_kvcache_turboquant.
quantize` (codes, scales, bit packing) and :mod:`~tallow_kvcache_turboquant.codec` (the cache
layout and the reference encode/decode).
"""

__version__ = "0.1.0"
