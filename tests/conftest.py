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


@pytest.fixture
def no_tallow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TALLOW_* variable of the calling shell reaches the test (config-source tests)."""
    import os

    for var in list(os.environ):
        if var.startswith("TALLOW_"):
            monkeypatch.delenv(var)


@pytest.fixture
def tiny() -> dict:
    """Keywords of a real ``LLM`` that builds in a fraction of a second on a CPU: the few-MB
    ``random:tiny-llama`` model with a small KV cache."""
    return dict(
        model="random:tiny-llama", device="cpu", dtype="float32", num_blocks=16, max_model_len=256
    )
