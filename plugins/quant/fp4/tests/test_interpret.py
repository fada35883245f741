"""Runs the kernel cases (``kernel_cases.py``) under Triton's CPU interpreter."""

from __future__ import annotations

from pathlib import Path

from tallow.plugin.testing import run_interpreted


def test_kernels_under_the_triton_interpreter() -> None:
    run_interpreted(Path(__file__).with_name("kernel_cases.py"))
