"""Runs the kernel cases (``kernel_cases.py``) under Triton's CPU interpreter, so CI without a
GPU checks every kernel of the plugin against its torch reference."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tallow.plugin.testing import run_interpreted


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs the triton package (its interpreter runs the kernels on CPU)",
)
def test_kernels_under_the_triton_interpreter() -> None:
    run_interpreted(Path(__file__).with_name("kernel_cases.py"), timeout=900)
