"""The rotation of K and V head vectors: a fixed random sign flip, then a Walsh–Hadamard
transform, as in TurboQuant (Zandieh et al., 2025, arXiv:2504.19874).

A random rotation spreads a vector's energy evenly over its coordinates: a key whose energy
sits in a few outlier channels (Qwen2 models have such channels) comes out with coordinates of
about equal size, which a scalar quantizer with one scale per vector represents far better.
The transform is orthogonal, so dot products are unchanged: attention rotates each query once
(``q @ R.T``) and scores it against rotated keys as they are stored, and the output, a mix of
rotated values, is rotated back once (``out @ R``).

Head sizes that are not powers of two (80, 96, ...) are rotated by two overlapping
transforms of the largest power of two P below the head size: signs, a Hadamard transform of
coordinates ``[0, P)``, fresh signs, a Hadamard transform of ``[D - P, D)``. Every coordinate
is mixed, and the result is still orthogonal.
"""

from __future__ import annotations

import math

import torch


def fast_hadamard(x: torch.Tensor) -> torch.Tensor:
    """The Walsh–Hadamard transform of the last dimension of ``x`` (a power of two), in
    O(n log n) butterflies, normalised (orthonormal: its own inverse)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"fast_hadamard: the last dimension must be a power of two, got {n}")
    lead = x.shape[:-1]
    h = 1
    while h < n:
        pairs = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, n)
        h *= 2
    return x / math.sqrt(n)


def random_signs(n: int, seed: int) -> torch.Tensor:
    """``n`` fixed random signs (+1/-1, float64) drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=gen).double() * 2 - 1


def rotate(x: torch.Tensor, seed: int) -> torch.Tensor:
    """The rotation of the head vectors in the last dimension of ``x`` (float64 recommended):
    signs then a Hadamard transform; for a head size that is not a power of two, two
    overlapping transforms (see the module docstring)."""
    d = x.shape[-1]
    p = 1 << (d.bit_length() - 1)
    x = x * random_signs(d, seed).to(x.dtype)
    if p == d:
        return fast_hadamard(x)
    x = torch.cat((fast_hadamard(x[..., :p]), x[..., p:]), dim=-1)
    x = x * random_signs(d, seed + 1).to(x.dtype)
    return torch.cat((x[..., : d - p], fast_hadamard(x[..., d - p :])), dim=-1)


def rotation_matrix(head_dim: int, seed: int = 0) -> torch.Tensor:
    """The rotation as a float32 matrix ``R`` [D, D] with ``rotate(x) == x @ R.T``
    (orthogonal: ``x == rotate(x) @ R``), computed in float64 by rotating the identity."""
    if head_dim < 1:
        raise ValueError(f"head size must be positive, got {head_dim}")
    eye = torch.eye(head_dim, dtype=torch.float64)
    return rotate(eye, seed).T.contiguous().float()
