"""Fixtures shared by tallow's core and end-to-end tests.

- ``qwen_gguf``: the path of the embedded default model, Qwen2.5-Coder-0.5B-Instruct as one GGUF
  file (assembled and verified once by :func:`tallow.default_model.default_model_path`).
"""

from __future__ import annotations

import pathlib

import pytest


@pytest.fixture(scope="session")
def qwen_gguf() -> pathlib.Path:
    from tallow.default_model import default_model_path

    return default_model_path()
