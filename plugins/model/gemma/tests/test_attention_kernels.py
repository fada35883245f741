"""Gemma-shaped paged attention through the Triton kernels (``gemma_attention_cases.py``): under
the Triton interpreter on any machine, natively on a CUDA GPU. Subprocesses, because the
interpreter must be switched on before triton is first imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CASES = Path(__file__).with_name("gemma_attention_cases.py")
pytest.importorskip("tallow_attention_triton", reason="tallow-attention-triton is not installed")


def _run(env: dict[str, str]) -> None:
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
        str(CASES),
    ]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, cwd=CASES.parent
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"Gemma-shaped attention cases failed:\n{report}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report


def test_gemma_shapes_under_the_triton_interpreter() -> None:
    _run(dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=""))


@pytest.mark.gpu
def test_gemma_shapes_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    _run(env)
