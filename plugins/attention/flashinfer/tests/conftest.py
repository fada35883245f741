"""Makes the tests' support module (flashinfer_cases.py) importable under
--import-mode=importlib, and compiles every FlashInfer module the GPU tests use at once, in
parallel, before the first of them runs (each asks for the ``flashinfer_modules`` fixture).
A module that fails to compile is reported here and fails the tests that load it (their own
load compiles it again and raises flashinfer's error); the others go on."""

from __future__ import annotations

import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _build(spec) -> str | None:
    try:
        spec.build(verbose=False)
    except Exception:  # noqa: BLE001 - reported, and raised again where the module is used
        return f"{spec.name}:\n{traceback.format_exc()[-3000:]}"
    return None


@pytest.fixture(scope="session")
def flashinfer_modules() -> None:
    from flashinfer_cases import all_jit_specs

    started = time.perf_counter()
    specs = [spec for spec in all_jit_specs() if not spec.is_aot]
    failed = []
    if specs:
        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            failed = [f for f in pool.map(_build, specs) if f]
    print(
        f"\nflashinfer: {len(specs)} JIT module(s) checked or compiled in "
        f"{time.perf_counter() - started:.0f}s"
    )
    for failure in failed:
        print(f"!! flashinfer module failed to compile: {failure}")
