"""mypy over the core, with the profile of ``[tool.mypy]`` in the root ``pyproject.toml``.

The plugin API and the configuration are checked strictly; the rest of the core under mypy's
default profile. A type error anywhere fails this test with mypy's report.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mypy import api as mypy_api  # in the test extra: a missing mypy fails here, not skips

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_passes_over_the_core() -> None:
    # mypy's cache (in the temporary directory unless $TALLOW_MYPY_CACHE names one) lets a second
    # run check only what changed; a fresh run costs about 45 s of one core.
    cache = os.environ.get("TALLOW_MYPY_CACHE") or os.path.join(
        tempfile.gettempdir(), "tallow-mypy-cache"
    )
    stdout, stderr, status = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            cache,
            "--no-error-summary",
            "--hide-error-context",
            "--show-error-codes",
        ]
    )
    assert status == 0, f"mypy found type errors in framework/tallow:\n{stdout}{stderr}"
