"""Which quant scheme serves a checkpoint: the one registered under its ``quant_method``, or
one listing the method in ``quant_methods`` whose ``detect`` recognises the config (several
schemes share ``compressed-tensors``); the chosen one reads the checkpoint's config before the
model is built, and a config it refuses stops loading naming the file and the field."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest
import torch

from tallow.engine.loader import choose_quant_scheme
from tallow.plugin import Checkpoint, ModelFileError, QuantScheme, RegistryError
from tallow.plugin.registry import QuantSchemeRegistry


def _scheme(name: str, fmt: str | None) -> type:
    class Scheme(QuantScheme):
        """Claims compressed-tensors checkpoints whose format is ``fmt``."""

        seen: ClassVar[list] = []

        @classmethod
        def detect(cls, config: dict[str, Any]) -> bool:
            return config.get("quantization_config", {}).get("format") == fmt

        def use_checkpoint_config(self, config: dict[str, Any]) -> None:
            super().use_checkpoint_config(config)
            if config["quantization_config"].get("bits") == 3:
                raise ValueError("quantization_config.bits: 3 is not supported")

    Scheme.name = name
    return Scheme


class _Registries:
    def __init__(self, schemes: QuantSchemeRegistry) -> None:
        self.quant_schemes = schemes


def _checkpoint(quant_method: str, **q: Any) -> Checkpoint:
    config = {"quantization_config": {"quant_method": quant_method, **q}}
    return Checkpoint("src", config, "LlamaForCausalLM", lambda: iter(()),
                      quantization=quant_method, config_path="/m/config.json")


def _registry() -> QuantSchemeRegistry:
    reg = QuantSchemeRegistry()
    reg.register("fp8", _scheme("fp8", "float-quantized"), priority=50,
                 quant_methods=("compressed-tensors",))
    reg.register("int4", _scheme("int4", "pack-quantized"), priority=90,
                 quant_methods=("gptq", "compressed-tensors"))
    return reg


def test_a_shared_quant_method_goes_to_the_scheme_that_detects_it():
    reg = _registry()
    assert [e.name for e in reg.for_quant_method("compressed-tensors")] == ["int4", "fp8"]
    cpu = torch.device("cpu")
    fp8 = choose_quant_scheme(_Registries(reg), _checkpoint("compressed-tensors",
                                                            format="float-quantized"),
                              device=cpu)
    assert fp8.name == "fp8"
    assert fp8.checkpoint_config["quantization_config"]["format"] == "float-quantized"
    int4 = choose_quant_scheme(_Registries(reg), _checkpoint("gptq", format="pack-quantized"),
                               device=cpu)
    assert int4.name == "int4"


def test_no_scheme_that_detects_it_dequantizes_at_load(caplog):
    with caplog.at_level(logging.INFO, logger="tallow.engine"):
        got = choose_quant_scheme(_Registries(_registry()),
                                  _checkpoint("compressed-tensors", format="nvfp4"),
                                  device=torch.device("cpu"))
    assert got is None
    assert "quant scheme 'int4' (from <unknown>) does not hold this kind of " \
           "compressed-tensors checkpoint" in caplog.text


def test_a_config_the_scheme_refuses_names_the_file_and_the_field():
    with pytest.raises(ModelFileError, match=r"^/m/config\.json: quant scheme 'int4' .*"
                                             r"quantization_config\.bits: 3"):
        choose_quant_scheme(_Registries(_registry()),
                            _checkpoint("gptq", format="pack-quantized", bits=3),
                            device=torch.device("cpu"))


def test_quant_methods_must_be_names():
    with pytest.raises(RegistryError, match="quant_methods"):
        QuantSchemeRegistry().register("x", _scheme("x", None), quant_methods="gptq")
