"""Runs the kernel cases (``kernel_cases.py``) under Triton's CPU interpreter, so CI without a
GPU checks every kernel of the plugin against its torch reference. ``TRITON_INTERPRET=1`` must
be set before triton is imported, hence the subprocess."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("kernel_cases.py")


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs the triton package (its interpreter runs the kernels on CPU)",
)
def test_kernels_under_the_triton_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        "-o",
        "addopts=",
        "-x",
        "-rs",
        "-n",
        str(min(2, os.cpu_count() or 1)),
        str(CASES),
    ]  # one interpreter per core
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, cwd=CASES.parent
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"kernel cases failed under TRITON_INTERPRET=1:\n{report}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
