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
    ckpt = Checkpoint(
        source="/models/toy",
        config=config,
        architecture="ToyForCausalLM",
        tensors=lambda: iter(()),
        config_path="/models/toy/config.json",
    )
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


class Dense:
    """A GGUF architecture that hands files with experts to ``ToyMoeForCausalLM``."""

    hf_architectures = ("ToyForCausalLM", "ToyAliasForCausalLM")

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        name = "ToyForCausalLM"
        if metadata.get("toy.expert_count"):
            name = "ToyMoeForCausalLM"
        elif metadata.get("toy.alias"):
            name = "ToyAliasForCausalLM"
        return {**config, "architectures": [name], "refined_by": "dense"}


class Sparse(Dense):
    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        return {**config, "architectures": ["ToyMoeForCausalLM"], "refined_by": "sparse"}


def _resolve_gguf(metadata: dict[str, Any], with_moe: bool = True):
    registries = Registries()
    registries.architectures.register("ToyForCausalLM", Dense, gguf=("toy",))
    if with_moe:
        registries.architectures.register("ToyMoeForCausalLM", Sparse)
    ckpt = Checkpoint(
        source="/models/toy.gguf",
        config={"hidden_size": 8},
        architecture="gguf:toy",
        tensors=lambda: iter(()),
        extra={"gguf_metadata": metadata},
    )
    return resolve_architecture(registries, ckpt)


def test_a_gguf_config_naming_another_architecture_hands_the_file_over():
    entry, config = _resolve_gguf({"toy.expert_count": 8})
    assert entry.name == "ToyMoeForCausalLM" and config["refined_by"] == "sparse"
    entry, config = _resolve_gguf({})
    assert entry.name == "ToyForCausalLM" and config["refined_by"] == "dense"
    # a name the class itself answers to is no hand-over
    entry, config = _resolve_gguf({"toy.alias": True})
    assert entry.name == "ToyForCausalLM" and config["architectures"] == ["ToyAliasForCausalLM"]


def test_a_hand_over_to_a_missing_architecture_names_it():
    from tallow.plugin import SelectionError

    with pytest.raises(SelectionError, match="served by ToyMoeForCausalLM"):
        _resolve_gguf({"toy.expert_count": 8}, with_moe=False)
