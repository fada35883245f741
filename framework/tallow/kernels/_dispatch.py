"""When a kernel entry point runs its Triton kernel rather than its torch reference."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.lru_cache(maxsize=1)
def triton_importable() -> bool:
    """Whether the ``triton`` package can be imported here (checked once, without importing)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def triton_enabled(tensor: torch.Tensor) -> bool:
    """Triton runs on CUDA tensors; under ``TRITON_INTERPRET=1`` it runs on CPU tensors too,
    which is how CI without a GPU checks the kernels' logic."""
    if not triton_importable():
        return False
    return tensor.is_cuda or (interpreting() and tensor.device.type == "cpu")
