"""Which quant scheme holds a model's weights (tallow.engine.quant_choice).

A scheme claims a checkpoint when it serves the checkpoint's quantization method (its name, or
a method in the ``quant_methods`` it registered) and its ``detect`` accepts the config: several
schemes share ``compressed-tensors`` (fp8, int4, fp4 weights). One claim serves and reads the
checkpoint's config (``use_checkpoint_config``, a refusal naming the file and the field); none
dequantizes at load; two are an error naming both and ``model.quant_scheme``, which picks one.
``model.isq`` goes to the one scheme offering the type, and an unknown type is refused listing
the types offered."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tallow.engine.quant_choice import choose_quant_scheme
from tallow.plugin import (
    Checkpoint,
    ModelFileError,
    QuantScheme,
    Registries,
    RegistryError,
    SelectionError,
)
from tallow.plugin.registry import QuantSchemeRegistry

CPU = torch.device("cpu")


def _scheme(name: str, fmt: str | None = None, isq: tuple[str, ...] = ()) -> type:
    """A scheme whose ``detect`` accepts configs of ``format`` ``fmt`` (None: the default
    ``detect``, every checkpoint of its methods) and which refuses 3-bit configs."""

    class Scheme(QuantScheme):
        isq_types = isq

        def use_checkpoint_config(self, config: dict[str, Any]) -> None:
            super().use_checkpoint_config(config)
            if config["quantization_config"].get("bits") == 3:
                raise ValueError("quantization_config.bits: 3 is not supported")

    if fmt is not None:
        Scheme.detect = classmethod(
            lambda cls, config: config.get("quantization_config", {}).get("format") == fmt
        )
    Scheme.name = name
    return Scheme


def _registries(**schemes: tuple[type, tuple[str, ...]]) -> Registries:
    registries = Registries()
    for priority, (name, (cls, methods)) in enumerate(schemes.items()):
        registries.quant_schemes.register(name, cls, priority=priority, quant_methods=methods)
    return registries


def _standard() -> Registries:
    """fp8 (its own method and compressed-tensors float-quantized), int4 (gptq, and
    compressed-tensors pack-quantized), gguf (its own method, the default detect)."""
    return _registries(
        fp8=(_scheme("fp8", "float-quantized", ("fp8",)), ("compressed-tensors",)),
        int4=(_scheme("int4", "pack-quantized", ("int4",)), ("gptq", "compressed-tensors")),
        gguf=(_scheme("gguf", None, ("q4_0", "q4_k")), ()),
    )


def _checkpoint(method: str | None, **quant: Any) -> Checkpoint:
    config = {"quantization_config": {"quant_method": method, **quant}} if method else {}
    return Checkpoint(
        source="/models/m",
        config=config,
        architecture="LlamaForCausalLM",
        tensors=lambda: iter(()),
        quantization=method,
        config_path="/models/m/config.json",
    )


def test_a_shared_method_goes_to_the_scheme_that_detects_it_and_it_reads_the_config():
    registries = _standard()
    for fmt, expected in (("float-quantized", "fp8"), ("pack-quantized", "int4")):
        ckpt = _checkpoint("compressed-tensors", format=fmt)
        scheme = choose_quant_scheme(registries, ckpt, device=CPU)
        assert scheme.name == expected and scheme.isq is None
        assert scheme.checkpoint_config == ckpt.config
    assert (
        choose_quant_scheme(
            registries, _checkpoint("gptq", format="pack-quantized"), device=CPU
        ).name
        == "int4"
    )


def test_the_default_detect_claims_every_checkpoint_of_the_schemes_methods():
    # a GGUF file of quantized blocks has no quantization_config: its method is its format's
    scheme = choose_quant_scheme(_standard(), _checkpoint("gguf"), device=CPU)
    assert scheme.name == "gguf"


def test_no_claim_dequantizes_at_load_saying_why(caplog):
    with caplog.at_level(logging.INFO, logger="tallow.engine"):
        got = choose_quant_scheme(
            _standard(), _checkpoint("compressed-tensors", format="nvfp4"), device=CPU
        )
        assert got is None
        assert (
            "quant scheme 'int4' (from <unknown>) does not hold this kind of "
            "compressed-tensors checkpoint" in caplog.text
        )
        assert choose_quant_scheme(_standard(), _checkpoint("bitsandbytes"), device=CPU) is None
        assert "no quant scheme serving 'bitsandbytes' is installed" in caplog.text


def test_two_claims_are_an_error_naming_both_and_the_setting_that_picks_one():
    registries = _registries(
        int4=(_scheme("int4", "pack-quantized"), ("compressed-tensors",)),
        marlin=(_scheme("marlin", "pack-quantized"), ("compressed-tensors",)),
    )
    ckpt = _checkpoint("compressed-tensors", format="pack-quantized")
    with pytest.raises(SelectionError) as info:
        choose_quant_scheme(registries, ckpt, device=CPU)
    message = str(info.value)
    assert "/models/m (compressed-tensors-quantized)" in message
    assert "'marlin' (from <unknown>) and 'int4' (from <unknown>) all claim it" in message
    assert "model.quant_scheme (--quant-scheme)" in message
    for name in ("int4", "marlin"):
        assert choose_quant_scheme(registries, ckpt, device=CPU, quant_scheme=name).name == name
    with pytest.raises(SelectionError, match="all claim it"):
        choose_quant_scheme(registries, ckpt, device=CPU, quant_scheme="auto")


def test_a_named_scheme_must_exist_and_claim_the_checkpoint():
    ckpt = _checkpoint("compressed-tensors", format="pack-quantized")
    with pytest.raises(
        SelectionError,
        match=r"^model\.quant_scheme 'fp4': unknown quant_scheme "
        r"'fp4' \(registered: fp8, gguf, int4\)",
    ):
        choose_quant_scheme(_standard(), ckpt, device=CPU, quant_scheme="fp4")
    with pytest.raises(
        SelectionError,
        match=r"^model\.quant_scheme 'fp8': quant scheme 'fp8' "
        r".*does not claim /models/m",
    ):
        choose_quant_scheme(_standard(), ckpt, device=CPU, quant_scheme="fp8")


def test_a_config_the_scheme_refuses_names_the_file_and_the_field():
    with pytest.raises(
        ModelFileError,
        match=r"^/models/m/config\.json: quant scheme 'int4' .*"
        r"quantization_config\.bits: 3",
    ):
        choose_quant_scheme(
            _standard(), _checkpoint("gptq", format="pack-quantized", bits=3), device=CPU
        )


def test_isq_goes_to_the_scheme_offering_the_type():
    scheme = choose_quant_scheme(_standard(), _checkpoint(None), device=CPU, isq="int4")
    assert scheme.name == "int4" and scheme.isq == "int4"
    with pytest.raises(SelectionError, match=r"already quantized \(gptq\)"):
        choose_quant_scheme(_standard(), _checkpoint("gptq"), device=CPU, isq="int4")


def test_an_unknown_isq_type_is_refused_listing_the_offered_ones():
    with pytest.raises(SelectionError) as info:
        choose_quant_scheme(_standard(), _checkpoint(None), device=CPU, isq="int3")
    message = str(info.value)
    assert message.startswith("model.isq 'int3': no installed quant scheme can quantize to it")
    assert "the installed ones offer: q4_0, q4_k (<unknown>); int4 (<unknown>); fp8" in message


def test_two_schemes_offering_an_isq_type_need_the_setting():
    registries = _registries(
        a=(_scheme("a", isq=("int4",)), ()), b=(_scheme("b", isq=("int4",)), ())
    )
    with pytest.raises(
        SelectionError,
        match=r"^model\.isq 'int4': quant schemes 'b' .* and "
        r"'a' .* all claim it; set model\.quant_scheme",
    ):
        choose_quant_scheme(registries, _checkpoint(None), device=CPU, isq="int4")
    assert (
        choose_quant_scheme(
            registries, _checkpoint(None), device=CPU, isq="int4", quant_scheme="a"
        ).name
        == "a"
    )
    with pytest.raises(SelectionError, match="does not quantize to model.isq 'fp8'"):
        choose_quant_scheme(
            _standard(), _checkpoint(None), device=CPU, isq="fp8", quant_scheme="int4"
        )


def test_quant_methods_must_be_names():
    with pytest.raises(RegistryError, match="quant_methods"):
        QuantSchemeRegistry().register("x", _scheme("x"), quant_methods="gptq")
    registry = QuantSchemeRegistry()
    registry.register("fp8", _scheme("fp8"), priority=1, quant_methods=("compressed-tensors",))
    registry.register("int4", _scheme("int4"), priority=2, quant_methods=("compressed-tensors",))
    assert [e.name for e in registry.for_quant_method("compressed-tensors")] == ["int4", "fp8"]
    assert [e.name for e in registry.for_quant_method("fp8")] == ["fp8"]
