"""A pytest plugin for GPU runs where several test processes share one card: after every test
its process hands the CUDA memory it no longer uses back to the driver. PyTorch's caching
allocator otherwise keeps a finished test's peak reserved for the life of the worker, and the
other workers' next models run out of memory.

Load it with ``-p pytest_gpu_memory`` and ``bench/gpu`` on ``PYTHONPATH``."""

from __future__ import annotations

import gc
import sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    torch = sys.modules.get("torch")  # a test that never imported torch left nothing on the card
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    gc.collect()  # models of the finished test still referenced only by reference cycles
    torch.cuda.empty_cache()
