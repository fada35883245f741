"""Runs the integer fused-MoE kernel cases (``moe_kernel_cases.py``) under Triton's CPU
interpreter, against their torch reference."""

from __future__ import annotations

from pathlib import Path

from tallow.plugin.testing import run_interpreted


def test_moe_kernels_under_the_triton_interpreter() -> None:
    run_interpreted(Path(__file__).with_name("moe_kernel_cases.py"), timeout=900)
