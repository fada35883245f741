"""Runs ``interpreted_cases.py`` (the model through its Triton kernels) under Triton's CPU
interpreter, in a fresh process (``TRITON_INTERPRET=1`` must be set before triton is
imported)."""

from __future__ import annotations

from pathlib import Path

from tallow.plugin.testing.interpreter import run_interpreted


def test_model_through_its_triton_kernels_in_the_interpreter():
    run_interpreted(Path(__file__).with_name("interpreted_cases.py"))
