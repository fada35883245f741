"""The triton backend against tallow's attention-backend conformance suite: under Triton's CPU
interpreter here (a fresh interpreter: TRITON_INTERPRET must be set before triton is imported),
and on a CUDA GPU directly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CASES = Path(__file__).with_name("conformance_cases.py")


def test_conformance_under_the_triton_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [
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
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=CASES.parent,
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"conformance failed under TRITON_INTERPRET=1:\n{report}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_conformance_on_the_gpu() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--import-mode=importlib",
            "-rs",
            str(CASES),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=CASES.parent,
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
