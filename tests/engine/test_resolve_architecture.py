"""The engine lets the architecture class complete a ``config.json`` (``config_from_hf``)
before anything is sized from it, and names the file when the class refuses it."""

from __future__ import annotations

from typing import Any

import pytest

from tallow.engine.loader import resolve_architecture
from tallow.plugin import Checkpoint, ModelFileError
from tallow.plugin.registry import Registries


class Completing:
    """Fills the default it knows, refuses a negative size."""

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        if config.get("hidden_size", 0) < 0:
            raise ValueError("model config: 'hidden_size' must be positive")
        return {"vocab_size": 1234, **config}


class Plain:
    """No hook: the config is taken as it is."""


def _resolve(cls: type, config: dict[str, Any]) -> dict[str, Any]:
    registries = Registries()
    registries.architectures.register("ToyForCausalLM", cls)
    ckpt = Checkpoint(source="/models/toy", config=config, architecture="ToyForCausalLM",
                      tensors=lambda: iter(()), config_path="/models/toy/config.json")
    entry, resolved = resolve_architecture(registries, ckpt)
    assert entry.name == "ToyForCausalLM"
    return resolved


def test_the_class_completes_the_config():
    assert _resolve(Completing, {"hidden_size": 8}) == {"vocab_size": 1234, "hidden_size": 8}
    assert _resolve(Plain, {"hidden_size": 8}) == {"hidden_size": 8}


def test_a_refusal_names_the_config_file():
    with pytest.raises(ModelFileError) as err:
        _resolve(Completing, {"hidden_size": -1})
    assert "/models/toy/config.json" in str(err.value)
    assert "'hidden_size' must be positive" in str(err.value)
