"""The latent attention (MLA) kernel cases under Triton's CPU interpreter (a subprocess: the
interpreter must be on before triton is imported)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tallow.plugin.testing.interpreter import run_interpreted


def test_mla_kernels_under_the_triton_interpreter() -> None:
    out = run_interpreted(Path(__file__).with_name("mla_cases.py"))
    assert "7 passed" in out, out[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mla_kernels_on_the_gpu() -> None:
    """The same cases compiled for the GPU, plus DeepSeek's own widths."""
    cases = Path(__file__).with_name("mla_cases.py")
    proc = subprocess.run(
        [
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
            str(cases),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cases.parent,
    )
    assert proc.returncode == 0 and "9 passed" in proc.stdout, proc.stdout[-4000:]
