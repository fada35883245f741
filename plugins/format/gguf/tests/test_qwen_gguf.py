"""The real Qwen2.5-Coder-0.5B-Instruct GGUF: config and tensors against transformers and the
gguf package."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import torch

from tallow.layers import QuantizedWeight
from tallow_format_gguf import format as gguf_format
from tallow_format_gguf.dequant import logical_shape, type_name


def test_checkpoint_identity(qwen_checkpoint, qwen_gguf_file):
    ck = qwen_checkpoint
    assert ck.architecture == "gguf:qwen2"
    assert ck.naming == "gguf"
    assert ck.quantization == "gguf"  # its matrices are block-quantized
    assert ck.source == str(qwen_gguf_file)
    meta = ck.extra["gguf_metadata"]
    assert meta["general.architecture"] == "qwen2"
    assert meta["qwen2.block_count"] == 24
    # the vocabulary arrays stay out; everything left is plain JSON
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        assert key not in meta
    json.dumps(meta)
    assert meta["tokenizer.chat_template"] == ck.tokenizer_config["chat_template"]
    assert "<tool_call>" in ck.chat_template


FIELDS = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "model_type",
]


def test_config_matches_transformers(qwen_checkpoint, hf_qwen_config):
    ours, ref = qwen_checkpoint.config, hf_qwen_config
    for name in FIELDS:
        assert ours[name] == getattr(ref, name), name
    assert ours["rope_theta"] == ref.rope_parameters["rope_theta"]
    assert ours["rope_parameters"]["rope_theta"] == ref.rope_parameters["rope_theta"]
    assert ours["head_dim"] == ref.hidden_size // ref.num_attention_heads
    assert ours["rope_scaling"] is None
    assert ours["sliding_window"] == ref.sliding_window
    assert ours["torch_dtype"] == "bfloat16"  # a block-quantized file


def _hf_parameter_shapes(hf_config) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of the transformers model built from transformers' own config for the
    file (on the meta device: shapes only)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _gguf_to_hf_names(hf_names, n_layers: int) -> dict[str, str]:
    import gguf

    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, n_layers)
    out = {}
    for hf in hf_names:
        base, _, suffix = hf.rpartition(".")
        mapped = name_map.get_name(base)
        if mapped is not None:
            out[f"{mapped}.{suffix}"] = hf
    return out


def test_every_tensor_shape_matches_transformers(qwen_model, hf_qwen_config):
    model = qwen_model
    hf_shapes = _hf_parameter_shapes(hf_qwen_config)
    names = _gguf_to_hf_names(hf_shapes, hf_qwen_config.num_hidden_layers)
    assert len(model.tensors) == 291
    for name, tensor in model.tensors.items():
        assert name in names, f"{name} has no transformers parameter"
        assert logical_shape(tensor) == hf_shapes[names[name]], name


def _sample(model, per_type: int = 2) -> list[str]:
    """Per GGUF type, the ``per_type`` smallest tensors (the large embeddings are included by
    ``test_output_projection`` on their own)."""
    by_type = defaultdict(list)
    for name, tensor in model.tensors.items():
        by_type[type_name(tensor)].append((int(tensor.n_elements), name))
    return [name for items in by_type.values() for _, name in sorted(items)[:per_type]]


def test_dequantized_tensors_equal_gguf_dequantizers(qwen_model, hf_qwen_config):
    import gguf

    model = qwen_model
    types = {type_name(t) for t in model.tensors.values()}
    assert {"Q5_0", "Q8_0", "Q6_K", "Q4_K", "F32"} <= types
    hf_shapes = _hf_parameter_shapes(hf_qwen_config)
    names = _gguf_to_hf_names(hf_shapes, hf_qwen_config.num_hidden_layers)
    sample = _sample(model)
    assert {type_name(model.tensors[n]) for n in sample} == types
    ours = dict(gguf_format._iter_tensors(_Subset(model, sample)))
    for name in sample:
        tensor = model.tensors[name]
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        got = ours[name]
        if isinstance(got, QuantizedWeight):  # block types come as the file's blocks
            assert got.qtype == type_name(tensor) and tuple(got.shape) == hf_shapes[names[name]]
            np.testing.assert_array_equal(got.data.numpy(), tensor.data)
            got = got.dequantize()
        else:
            assert type_name(tensor) == "F32"
        assert got.dtype == torch.float32
        assert tuple(got.shape) == hf_shapes[names[name]], name
        np.testing.assert_array_equal(
            got.numpy(), np.asarray(expected, dtype=np.float32).reshape(got.shape), err_msg=name
        )
        assert torch.isfinite(got).all()


def test_output_projection_is_vocab_by_hidden(qwen_model):
    import gguf

    tensor = qwen_model.tensors["output.weight"]
    assert type_name(tensor) == "Q8_0"
    assert logical_shape(tensor) == (151936, 896)
    # the first rows only: the whole matrix is 0.5 GB in float32
    rows = _RowSlice(tensor, 4)
    ours = dict(gguf_format._iter_tensors(_Subset.of({"output.weight": rows})))["output.weight"]
    assert tuple(ours.shape) == (4, 896) and ours.qtype == "Q8_0"
    np.testing.assert_array_equal(
        ours.dequantize().numpy(), gguf.quants.dequantize(tensor.data[:4], tensor.tensor_type)
    )


def test_tensors_are_lazy(qwen_checkpoint, monkeypatch):
    calls = []

    def counting(tensor):
        calls.append(tensor.name)
        return torch.zeros(1)

    monkeypatch.setattr(gguf_format, "read_tensor", counting)
    it = qwen_checkpoint.tensors()
    assert calls == []
    first = [next(it) for _ in range(3)]
    assert len(calls) == 3
    assert [n for n, _ in first] == calls
    # a fresh call starts over
    assert next(qwen_checkpoint.tensors())[0] == calls[0]


class _RowSlice:
    """The first ``n`` rows of a reader tensor, as a reader tensor."""

    def __init__(self, tensor, n):
        self.name = tensor.name
        self.tensor_type = tensor.tensor_type
        self.shape = [int(tensor.shape[0]), n]  # GGUF order: row length first
        self.data = tensor.data[:n]


class _Subset:
    """A GGUFModelFile view holding only some tensors (to dequantize a sample)."""

    def __init__(self, model, names):
        self.tensors = {n: model.tensors[n] for n in names}

    @classmethod
    def of(cls, tensors):
        view = cls.__new__(cls)
        view.tensors = dict(tensors)
        return view


@pytest.mark.parametrize("bad", [None, 3, "model.safetensors", "/nonexistent/x.gguf", "/tmp"])
def test_claims_refuses_what_is_not_a_gguf_file(bad):
    assert gguf_format.GGUFFormat.claims(bad) is False


def test_claims_a_gguf_file(qwen_gguf_file):
    assert gguf_format.GGUFFormat.claims(str(qwen_gguf_file)) is True
