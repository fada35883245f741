"""The *quad* layout of packed codes that :mod:`tallow.kernels.code_bits` decodes, on the
torch side: packing and unpacking (plain torch, no Triton).

Each row of codes is stored as int32 words in quads of 4 words (16 bytes, one vector load):
32 four-bit or 16 eight-bit codes. Inside a quad, word ``u`` holds in its slot ``s`` (bits
``bits * s`` and up) the code of column ``4 * s + u`` of the quad. So slot ``s`` of the 4
words is 4 consecutive columns (their activations are one vector load), and one shift of a
word brings two 4-bit slots (a byte) to where the kernels decode them.
"""

from __future__ import annotations

import torch

#: columns of one quad (16 bytes of codes) per code width
QUAD_COLUMNS = {4: 32, 8: 16}


def pack_quads(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes ``[rows, cols]`` (any integer dtype, values below ``2**bits``, ``cols``
    a multiple of the quad's columns) → int32 words ``[rows, cols * bits / 32]``."""
    rows, cols = codes.shape
    per_word = 32 // bits
    quads = codes.to(torch.int64).reshape(rows, cols // (4 * per_word), per_word, 4)
    shifts = torch.arange(per_word, device=codes.device, dtype=torch.int64) * bits
    words = (quads << shifts[None, None, :, None]).sum(dim=2)  # [rows, quad, 4]
    words = torch.where(words >= 2**31, words - 2**32, words)  # the int32 bit pattern
    return words.to(torch.int32).reshape(rows, cols * bits // 32)


def unpack_quads(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words ``[rows, n]`` → unsigned codes ``[rows, n * 32 / bits]`` (uint8), the
    inverse of :func:`pack_quads`."""
    rows, n = words.shape
    per_word = 32 // bits
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int32) * bits
    quads = words.reshape(rows, n // 4, 1, 4)
    codes = (quads >> shifts[None, None, :, None]) & ((1 << bits) - 1)  # [rows, quad, slot, 4]
    return codes.to(torch.uint8).reshape(rows, n * per_word)
