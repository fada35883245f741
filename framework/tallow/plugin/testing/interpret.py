"""Run a module of Triton kernel cases under Triton's CPU interpreter, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_interpreted(cases: str | os.PathLike[str], *, timeout: float = 600) -> None:
    """Run the pytest module ``cases`` with ``TRITON_INTERPRET=1`` (the interpreter must be
    switched on before triton is first imported, hence the subprocess) and no CUDA device, so
    CI without a GPU checks a plugin's kernels against their torch references. Fails with the
    report unless every case passed and none was skipped."""
    import pytest

    cases = Path(cases)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "--import-mode=importlib", "-o", "addopts=", "-x", "-rs", str(cases)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=cases.parent)
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    if proc.returncode != 0:
        pytest.fail(f"kernel cases failed under TRITON_INTERPRET=1:\n{report}")
    if " passed" not in proc.stdout or "skipped" in proc.stdout:
        pytest.fail(f"kernel cases did not all run under TRITON_INTERPRET=1:\n{report}")
