"""ArchConfig: an HF config with attribute access and named errors for required keys."""

from __future__ import annotations

import pytest

from tallow.layers import ArchConfig


def test_require_returns_present_values_and_names_missing_or_null_keys():
    cfg = ArchConfig({"hidden_size": 64, "vocab_size": None})
    assert cfg.require("hidden_size") == 64 == cfg.hidden_size
    with pytest.raises(ValueError, match="model config: 'vocab_size' is required"):
        cfg.require("vocab_size")
    with pytest.raises(ValueError, match="model config: 'num_hidden_layers' is required"):
        cfg.require("num_hidden_layers")
    with pytest.raises(AttributeError, match="model config has no 'num_hidden_layers'"):
        cfg.num_hidden_layers  # noqa: B018
