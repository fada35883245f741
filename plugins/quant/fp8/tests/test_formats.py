"""Reading ``quantization_config``: both dialects map onto the storage the kernels take, what
the plugin cannot serve is refused naming the field, and the compressed-tensors configs are
those the ``compressed-tensors`` package itself writes."""

from __future__ import annotations

import copy

import pytest

from tallow_quant_fp8.formats import Fp8Config, detects, parse


def hf_fp8(**fields):
    return {"quantization_config": {"quant_method": "fp8", **fields}}


def ct_preset(name: str, ignore=("lm_head",)) -> dict:
    """The ``quantization_config`` compressed-tensors writes for its preset scheme ``name``."""
    ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors writes the config")
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        preset_name_to_scheme,
    )

    config = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(name, ["Linear"])},
        ignore=list(ignore),
        format="float-quantized",
        quantization_status=QuantizationStatus.COMPRESSED,
    )
    data = config.model_dump(mode="json")
    data["quant_method"] = "compressed-tensors"
    data["version"] = ct.__version__
    return {"quantization_config": data}


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"activation_scheme": "dynamic"}, Fp8Config("tensor", "token", "fp8")),
        ({"activation_scheme": "static"}, Fp8Config("tensor", "static", "fp8")),
        (
            {"activation_scheme": "dynamic", "weight_block_size": [128, 128], "fmt": "e4m3"},
            Fp8Config("block", "group", "fp8"),
        ),
        ({}, Fp8Config("tensor", "token", "fp8")),
    ],
)
def test_hf_fp8_configs(fields, expected):
    config = hf_fp8(**fields)
    assert detects(config)
    assert parse(config) == expected
    assert parse(config).scale_name == ("weight_scale_inv" if expected.block else "weight_scale")


@pytest.mark.parametrize(
    "preset,expected",
    [
        ("FP8", Fp8Config("tensor", "static", "compressed-tensors")),
        ("FP8_DYNAMIC", Fp8Config("channel", "token", "compressed-tensors")),
        ("FP8_BLOCK", Fp8Config("block", "group", "compressed-tensors")),
    ],
)
def test_compressed_tensors_presets(preset, expected):
    config = ct_preset(preset)
    assert detects(config)
    got = parse(config)
    assert got == expected
    assert got.scale_name == "weight_scale"


def test_weights_only_compressed_tensors():
    config = ct_preset("FP8_DYNAMIC")
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = None
    assert parse(config) == Fp8Config("channel", "none", "compressed-tensors")


def test_other_methods_are_not_detected():
    assert not detects({})
    assert not detects({"quantization_config": {"quant_method": "gptq", "bits": 4}})
    w4a16 = ct_preset("FP8_DYNAMIC")
    w4a16["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        type="int", num_bits=4
    )
    assert not detects(w4a16)  # an int4 scheme's checkpoint


def _ct(path: str, value):
    config = copy.deepcopy(ct_preset("FP8_DYNAMIC"))
    target = config["quantization_config"]
    *parents, last = path.split(".")
    for key in parents:
        target = target[key]
    target[last] = value
    return config


@pytest.mark.parametrize(
    "config,field",
    [
        (hf_fp8(fmt="e5m2"), "quantization_config.fmt"),
        (hf_fp8(activation_scheme="per-token"), "quantization_config.activation_scheme"),
        (hf_fp8(weight_block_size=[64, 64]), "quantization_config.weight_block_size"),
        (
            hf_fp8(weight_block_size=[128, 128], activation_scheme="static"),
            "quantization_config.activation_scheme",
        ),
        (hf_fp8(weight_block_size=[128, 128], scale_fmt="e4m3"), "quantization_config.scale_fmt"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method"),
        ({"quantization_config": None}, "quantization_config"),
        (
            _ct("config_groups.group_0.weights.strategy", "group"),
            "quantization_config.config_groups.group_0.weights.strategy",
        ),
        (
            _ct("config_groups.group_0.weights.symmetric", False),
            "quantization_config.config_groups.group_0.weights.symmetric",
        ),
        (
            _ct("config_groups.group_0.input_activations.dynamic", False),
            "quantization_config.config_groups.group_0.input_activations",
        ),
        (
            _ct("config_groups.group_0.input_activations.num_bits", 4),
            "quantization_config.config_groups.group_0.input_activations",
        ),
        (_ct("config_groups", {}), "quantization_config.config_groups"),
        (_ct("format", "pack-quantized"), "quantization_config.config_groups.group_0.format"),
        (_ct("quantization_status", "frozen"), "quantization_config.quantization_status"),
        (
            _ct("kv_cache_scheme", {"num_bits": 8, "type": "float"}),
            "quantization_config.kv_cache_scheme",
        ),
    ],
)
def test_unsupported_configs_name_the_field(config, field):
    with pytest.raises(ValueError, match=rf"^{field.replace('.', '[.]')}\b"):
        parse(config)


def test_groups_must_agree():
    config = ct_preset("FP8_DYNAMIC")
    groups = config["quantization_config"]["config_groups"]
    groups["group_1"] = copy.deepcopy(groups["group_0"])
    groups["group_1"]["weights"]["strategy"] = "tensor"
    with pytest.raises(ValueError, match=r"config_groups\.group_1: every group must quantize"):
        parse(config)
