"""Runs the kernel tests (``test_kernels.py``, ``test_token_bitmask.py``,
``test_moe_kernels.py``, ``test_gated_delta_kernels.py``, ``test_packed_gemm_kernels.py``)
under Triton's CPU interpreter, so that CI without a GPU checks every kernel against its torch
reference at tiny shapes.

``TRITON_INTERPRET=1`` must be set before triton is imported, hence a fresh interpreter process.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs the triton package (its interpreter runs the kernels on CPU)",
)
@pytest.mark.parametrize(
    "module",
    [
        "test_kernels.py",
        "test_token_bitmask.py",
        "test_moe_kernels.py",
        "test_gated_delta_kernels.py",
        "test_packed_gemm_kernels.py",
    ],
)
def test_kernels_under_triton_interpreter(module):
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "--import-mode=importlib",
            "-o",
            "addopts=",
            str(HERE / module),
        ],
        cwd=HERE.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, tail
