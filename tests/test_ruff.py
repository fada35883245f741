"""ruff over the whole tree, with the rules of ``[tool.ruff]`` in pyproject.toml."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes_over_the_tree() -> None:
    assert importlib.util.find_spec("ruff") is not None, (
        "ruff is not installed: it is in the test extra (make install)"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff_format_leaves_the_tree_unchanged() -> None:
    """Every Python file is as ``ruff format`` writes it (run ``ruff format`` before committing)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--no-cache", "--check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff_finds_what_the_rules_select(tmp_path: Path) -> None:
    """The configuration is the one in force: an unused import and a syntax error fail."""
    (tmp_path / "bad.py").write_text("import os\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--config",
            str(ROOT / "pyproject.toml"),
            "--output-format",
            "concise",
            ".",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "bad.py:1:8: F401" in proc.stdout, proc.stdout
    assert "broken.py:1:7: invalid-syntax" in proc.stdout, proc.stdout
