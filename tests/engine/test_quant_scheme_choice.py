"""How the loader picks the quant scheme of a quantized checkpoint: by the checkpoint's
``quantization`` name, else by a scheme's ``detect`` of the config (one ``quant_method`` such
as ``compressed-tensors`` covers encodings that different schemes serve); the chosen instance
receives the checkpoint's config, and a config it refuses stops the load naming the file."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tallow.engine.loader import choose_quant_scheme
from tallow.plugin import Checkpoint, ModelFileError, QuantScheme, Registries


def _scheme(name: str, method: str, fmt: str | None = None, refuse: str | None = None) -> type:
    class Scheme(QuantScheme):
        def __init__(self, config: Any = None, isq: str | None = None) -> None:
            super().__init__(config, isq)
            self.seen: dict | None = None

        @classmethod
        def detect(cls, config: dict) -> bool:
            q = config.get("quantization_config", {})
            return q.get("quant_method") == method and (fmt is None or q.get("format") == fmt)

        def configure_checkpoint(self, config: dict) -> None:
            if refuse:
                raise ValueError(refuse)
            self.seen = config

    Scheme.name = name
    return Scheme


def _registries(*schemes: type) -> Registries:
    registries = Registries()
    for i, cls in enumerate(schemes):
        registries.quant_schemes.register(cls.name, cls, priority=10 * i)
    return registries


def _checkpoint(quantization: str, **quant: Any) -> Checkpoint:
    config = {"quantization_config": {"quant_method": quantization, **quant}}
    return Checkpoint(source="/models/m", config=config, architecture="LlamaForCausalLM",
                      tensors=lambda: iter(()), quantization=quantization,
                      config_path="/models/m/config.json")


def test_a_scheme_registered_under_the_name_serves_and_gets_the_config():
    registries = _registries(_scheme("fp8", "fp8"))
    ckpt = _checkpoint("fp8", activation_scheme="dynamic")
    scheme = choose_quant_scheme(registries, ckpt, device=torch.device("cpu"))
    assert scheme.name == "fp8" and scheme.seen == ckpt.config


def test_a_method_no_scheme_is_named_after_goes_to_the_scheme_that_detects_it():
    registries = _registries(_scheme("int4", "compressed-tensors", "pack-quantized"),
                             _scheme("fp8", "compressed-tensors", "float-quantized"))
    for fmt, expected in (("float-quantized", "fp8"), ("pack-quantized", "int4")):
        ckpt = _checkpoint("compressed-tensors", format=fmt)
        assert choose_quant_scheme(registries, ckpt, device=torch.device("cpu")).name == expected
    # nobody detects it: dequantized at load, as for a scheme that is not installed
    ckpt = _checkpoint("compressed-tensors", format="nvfp4-pack-quantized")
    assert choose_quant_scheme(registries, ckpt, device=torch.device("cpu")) is None


def test_a_refused_config_stops_the_load_naming_the_file():
    registries = _registries(_scheme("fp8", "fp8", refuse="quantization_config.fmt: only e4m3"))
    with pytest.raises(ModelFileError, match=r"^/models/m/config\.json: quantization_config\.fmt"):
        choose_quant_scheme(registries, _checkpoint("fp8", fmt="e5m2"),
                            device=torch.device("cpu"))
