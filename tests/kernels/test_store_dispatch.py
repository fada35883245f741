"""Where ``tallow.kernels.store_kv`` must not take its Triton kernel: an e4m3 cache on a GPU
older than Ada, for which Triton has no e4m3 conversions (the kernel would fail to compile)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tallow.kernels import kv_store


@pytest.mark.parametrize(("dtype", "capability", "is_cuda", "unsupported"), [
    (torch.float8_e4m3fn, (8, 0), True, True),
    (torch.float8_e4m3fn, (8, 6), True, True),
    (torch.float8_e4m3fn, (8, 9), True, False),
    (torch.float8_e4m3fn, (9, 0), True, False),
    (torch.float8_e5m2, (8, 0), True, False),
    (torch.bfloat16, (8, 0), True, False),
    (torch.float8_e4m3fn, (8, 0), False, False),  # CPU tensors: the interpreter or torch
])
def test_e4m3_cache_below_ada_takes_the_torch_store(monkeypatch, dtype, capability, is_cuda,
                                                    unsupported):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cache = SimpleNamespace(dtype=dtype, is_cuda=is_cuda, device="cuda:0" if is_cuda else "cpu")
    assert kv_store._e4m3_unsupported(cache) is unsupported
