"""Running a plugin's kernel test cases under Triton's CPU interpreter from an ordinary test.

``TRITON_INTERPRET=1`` must be set before triton is imported, so the cases run in a fresh
pytest process (on CPU tensors, with no GPU visible)::

    def test_kernels_under_the_triton_interpreter():
        run_interpreted(Path(__file__).with_name("kernel_cases.py"))
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_interpreted(cases: str | os.PathLike[str], *, timeout: float = 900) -> str:
    """Run the pytest module ``cases`` with ``TRITON_INTERPRET=1`` in a subprocess (from its
    folder, ``--import-mode=importlib``); fail with the report unless every case passed and
    none skipped. Skips the calling test when triton is not installed. Returns the output."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs the triton package (its interpreter runs the kernels on CPU)")
    cases = Path(cases)
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
        str(cases),
    ]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cases.parent
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    if proc.returncode != 0:
        pytest.fail(f"kernel cases failed under TRITON_INTERPRET=1:\n{report}")
    if " passed" not in proc.stdout or "skipped" in proc.stdout:
        pytest.fail(f"kernel cases did not all run under TRITON_INTERPRET=1:\n{report}")
    return proc.stdout
