"""Float32 building blocks of the quantizers that give the same bits on every device.

The quantizers reproduce reference algorithms written in C (llama.cpp) and numpy (the ``gguf``
package) operation for operation, so that the same input gives the same bytes. Three torch
habits would break that, and these helpers avoid them:

- a Python-number divisor is turned into a multiplication by its reciprocal on CUDA (two
  roundings instead of one): divide by a 0-d tensor instead (:func:`scalar`);
- ``Tensor.sum`` adds in a tree order of its own: a reference that accumulates left to right
  is followed by :func:`seqsum`;
- ``torch.round`` is fine, but llama.cpp's ``nearest_int`` is a float trick that differs from
  it for out-of-range input: :func:`nearest_int` is that trick;
- ``torch.sqrt`` of float32 on the CPU is not always correctly rounded (it can land one unit
  in the last place below C's ``sqrtf``): :func:`sqrt_f32` takes the root in float64.
"""

from __future__ import annotations

import torch

#: 1.5 * 2**23: adding it to a float32 of magnitude below 2**22 leaves the rounded integer in
#: the low mantissa bits.
_ROUNDING_MAGIC = 12582912.0


def scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d float32 tensor on ``like``'s device (see the module note); filled on
    the device, so no host-to-device copy waits for the queued work."""
    return torch.full((), value, dtype=torch.float32, device=like.device)


def nearest_int(x: torch.Tensor) -> torch.Tensor:
    """llama.cpp's ``nearest_int``: round to nearest, ties to even, for ``|x| < 2**22`` (int32).

    Outside that range (and for inf/nan) it yields the same deterministic garbage as the C
    code, which its callers clamp."""
    biased = (x + _ROUNDING_MAGIC).contiguous()
    return (biased.view(torch.int32) & 0x007FFFFF) - 0x00400000


def sqrt_f32(x: torch.Tensor) -> torch.Tensor:
    """C's ``sqrtf``: the float32 square root, correctly rounded. The float64 root of a float32
    rounded to float32 is (53 bits hold more than twice 24 + 2, so the double rounding cannot
    change the result)."""
    return torch.sqrt(x.to(torch.float64)).to(torch.float32)


def seqsum(terms: torch.Tensor) -> torch.Tensor:
    """Sum over the first dimension, left to right from 0.0, in float32: the order of a C loop
    ``for (i...) acc += term[i]``. ``terms`` is [n, ...]; returns [...]."""
    acc = torch.zeros_like(terms[0])
    for i in range(terms.shape[0]):
        acc.add_(terms[i])
    return acc


def f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 [..., k] → the little-endian float16 bytes [..., 2k] (round to nearest even, as
    ``GGML_FP32_TO_FP16`` and numpy's ``astype(float16)``)."""
    return x.to(torch.float16).contiguous().view(torch.uint8)


def f16_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded through float16 and back: the value a stored scale has when read."""
    return x.to(torch.float16).to(torch.float32)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """[..., 8k] values 0/1 → [..., k] bytes, element ``8i + b`` in bit ``b`` of byte ``i``."""
    shape = bits.shape
    grouped = bits.reshape(*shape[:-1], shape[-1] // 8, 8).to(torch.int32)
    weights = torch.pow(2, torch.arange(8, dtype=torch.int32, device=bits.device))
    return (grouped * weights).sum(dim=-1).to(torch.uint8)


def as_byte(x: torch.Tensor) -> torch.Tensor:
    """An integer tensor stored into a C ``uint8_t``/``int8_t``: its value modulo 256."""
    return (x.to(torch.int32) & 0xFF).to(torch.uint8)
