"""{{ cookiecutter.project_slug }} against tallow's conformance suite for its kind
(tallow.plugin.testing): the suite loads the component through this distribution's installed
entry point, so install the project first (pip install -e .)."""

from __future__ import annotations
{% if cookiecutter.kind == "tool-parser" %}
from tallow.plugin.testing import ToolParserConformance


class TestConformance(ToolParserConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"
    examples = [
        ('CALL get_weather {"city": "Paris"}\n', [("get_weather", {"city": "Paris"})]),
        ('Let me look.\nCALL get_weather {"city": "東京"}\nCALL search {"q": [1, null]}',
         [("get_weather", {"city": "東京"}), ("search", {"q": [1, None]})]),
    ]
{% elif cookiecutter.kind == "model" %}
from typing import Any

from tallow.plugin.testing import ModelArchitectureConformance


class TestConformance(ModelArchitectureConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"

    def hf_config(self) -> Any:
        import transformers

        return transformers.ArceeConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
            rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
{% elif cookiecutter.kind == "weight-format" %}
import json
from pathlib import Path

import numpy as np

from tallow.plugin.testing import WeightFormatConformance, WrittenCheckpoint
from tallow.plugin.testing.weight_format import tiny_llama_checkpoint


class TestConformance(WeightFormatConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"

    def write_checkpoint(self, directory: Path) -> WrittenCheckpoint:
        config, tensors = tiny_llama_checkpoint()
        directory.mkdir(parents=True)
        (directory / "config.json").write_text(json.dumps(config))
        np.savez(directory / "model.npz", **{k: v.numpy() for k, v in tensors.items()})
        return WrittenCheckpoint(str(directory), tensors, "LlamaForCausalLM",
                                 [directory / "model.npz"])
{% elif cookiecutter.kind == "quant-scheme" %}
import pytest
import torch

from tallow.plugin.testing import QuantizedLayer, QuantSchemeConformance
from {{ cookiecutter.package_name }}.scheme import QTYPE, SCHEME, RowInt8Scheme, quantize

#: what a checkpoint of this scheme's rows says in its config.json
CHECKPOINT_CONFIG = {"quantization_config": {"quant_method": SCHEME, "format": QTYPE, "bits": 8}}


class TestConformance(QuantSchemeConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"

    def quantized_layers(self, rows: int, cols: int) -> list[QuantizedLayer]:
        weight = quantize(torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)))
        return [QuantizedLayer(QTYPE, {"": weight}, weight.dequantize(), CHECKPOINT_CONFIG)]


def test_a_checkpoint_config_it_cannot_serve_is_refused_naming_the_field() -> None:
    config = {"quantization_config": {**CHECKPOINT_CONFIG["quantization_config"], "bits": 4}}
    assert RowInt8Scheme.detect(config)
    with pytest.raises(ValueError, match=r"^quantization_config\.bits: expected 8, got 4$"):
        RowInt8Scheme().use_checkpoint_config(config)
{% elif cookiecutter.kind == "kv-codec" %}
from tallow.plugin.testing import KVCodecConformance


class TestConformance(KVCodecConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"
    # rounding to nearest float16: half a unit in the last place (2**-11 relative) for normal
    # numbers, half the subnormal step (2**-25) below them
    relative_tolerance = 2.0 ** -11
    absolute_tolerance = 2.0 ** -25
{% elif cookiecutter.kind == "attention-backend" %}
from tallow.plugin.testing import AttentionBackendConformance


class TestConformance(AttentionBackendConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"
    kv_codecs = ("auto",)
{% elif cookiecutter.kind == "tool-provider" %}
from tallow.plugin.testing import ToolProviderConformance


class TestConformance(ToolProviderConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"
    sample_call = ("add", {"a": 1, "b": 2.5})
{% elif cookiecutter.kind == "routes" %}
from tallow.plugin.testing import RouteConformance


class TestConformance(RouteConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"
{% elif cookiecutter.kind == "grammar-backend" %}
from tallow.plugin.testing import GrammarBackendConformance


class TestConformance(GrammarBackendConformance):
    distribution = "{{ cookiecutter.project_slug }}"
    component = "{{ cookiecutter.component_name }}"
{% endif %}
