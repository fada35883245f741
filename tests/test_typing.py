"""mypy over the core, with the profile of ``[tool.mypy]`` in the root ``pyproject.toml``.

The plugin API and the configuration are checked strictly; the rest of the core under mypy's
default profile. A type error anywhere fails this test with mypy's report.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is in the test extra (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_passes_over_the_core() -> None:
    # The cache lives beside the checkout's other throwaway state, so that a second run (and CI
    # with a cached workspace) checks only what changed; a fresh one costs ~35 s on 2 cores.
    cache = os.environ.get("TALLOW_MYPY_CACHE") or os.path.join(tempfile.gettempdir(),
                                                                 "tallow-mypy-cache")
    stdout, stderr, status = mypy_api.run([
        "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", cache,
        "--no-error-summary", "--hide-error-context", "--show-error-codes",
    ])
    assert status == 0, f"mypy found type errors in framework/tallow:\n{stdout}{stderr}"
