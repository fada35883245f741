"""Run the kernel cases (``kernel_cases.py``, ``kv_sharing_cases.py``) under Triton's CPU
interpreter, so CI without a GPU checks the kernels' logic. The interpreter must be switched on
before triton is first imported, hence the subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.parametrize("cases", ["kernel_cases.py", "kv_sharing_cases.py"])
def test_kernels_under_the_triton_interpreter(cases: str) -> None:
    path = HERE / cases
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        "-x",
        "-rs",
        "-n",
        str(min(2, os.cpu_count() or 1)),
        str(path),
    ]  # independent cases: one interpreter process per core (up to two)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=HERE)
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"kernel cases failed under TRITON_INTERPRET=1:\n{report}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
