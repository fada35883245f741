"""Makes the tests' support module (flashinfer_cases.py) importable under
--import-mode=importlib, and compiles every FlashInfer module the GPU tests use at once, in
parallel, before the first of them runs (each asks for the ``flashinfer_modules`` fixture)."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def flashinfer_modules() -> None:
    from flashinfer_cases import all_jit_specs

    started = time.perf_counter()
    specs = [spec for spec in all_jit_specs() if not spec.is_aot]
    if specs:
        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            list(pool.map(lambda spec: spec.build(verbose=False), specs))
    print(f"\nflashinfer: {len(specs)} JIT module(s) checked or compiled in "
          f"{time.perf_counter() - started:.0f}s")
