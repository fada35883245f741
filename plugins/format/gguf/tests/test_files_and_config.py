"""Split shards, quantized tensors round-tripped through the gguf package, the generic config
mapping, and the plugin's registration."""

from __future__ import annotations

import numpy as np
import pytest

import gguf_synthetic as gs
from tallow.plugin import ModelFileError, WeightFormatRegistry
from tallow_format_gguf import plugin
from tallow_format_gguf.config import config_from_metadata, torch_dtype_of
from tallow_format_gguf.format import GGUFFormat
from tallow_format_gguf.reader import shard_paths


def _tensors():
    import gguf

    rng = np.random.default_rng(0)
    n_vocab = len(gs.sentencepiece_vocab()[0])
    Q = gguf.GGMLQuantizationType
    return {
        "token_embd.weight": (rng.standard_normal((n_vocab, 64)).astype(np.float32), Q.Q8_0),
        "blk.0.attn_q.weight": (rng.standard_normal((64, 64)).astype(np.float32), Q.Q4_0),
        "blk.0.attn_k.weight": (rng.standard_normal((32, 64)).astype(np.float32), Q.Q5_0),
        "blk.0.ffn_down.weight": (rng.standard_normal((64, 128)).astype(np.float32), Q.F16),
        "blk.0.ffn_up.weight": (rng.standard_normal((128, 64)).astype(np.float32), Q.BF16),
        "blk.0.attn_norm.weight": (rng.standard_normal((64,)).astype(np.float32), Q.F32),
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    tensors = _tensors()
    single = gs.write_sentencepiece_gguf(root / "tiny.gguf", tensors=tensors)[0]
    shards = gs.write_sentencepiece_gguf(
        root / "tiny-split.gguf", tensors=tensors, split_max_tensors=2
    )
    return tensors, single, shards


def _values(tensor) -> np.ndarray:
    """float32 values of a checkpoint tensor, whether float or still block-quantized."""
    from tallow.layers import QuantizedWeight

    if isinstance(tensor, QuantizedWeight):
        tensor = tensor.dequantize()
    return tensor.numpy()


def test_tensors_come_in_torch_order_float_or_as_blocks(written):
    import gguf
    import torch
    from tallow.layers import QuantizedWeight

    tensors, single, _ = written
    ck = GGUFFormat().load(str(single))
    assert ck.quantization == "gguf"  # Q8_0, Q4_0, Q5_0 tensors are in the file
    got = dict(ck.tensors())
    assert set(got) == set(tensors)
    for name, (array, qtype) in tensors.items():
        t = got[name]
        assert tuple(t.shape) == array.shape, name  # [out, in], as written
        blocks = gguf.quants.quantize(array, qtype)
        if qtype.name in ("F32", "F16", "BF16"):
            assert isinstance(t, torch.Tensor) and t.dtype == torch.float32, name
        else:  # the file's blocks as they are, one row of blocks per matrix row
            assert isinstance(t, QuantizedWeight) and (t.scheme, t.qtype) == ("gguf", qtype.name)
            np.testing.assert_array_equal(t.data.numpy(), blocks, err_msg=name)
        # the gguf package's own round trip is the oracle of the values
        expected = gguf.quants.dequantize(blocks, qtype)
        values = _values(t)
        np.testing.assert_array_equal(values, np.asarray(expected, np.float32), err_msg=name)
        # and the values are the written ones up to quantization error
        tol = {"F32": 0, "F16": 1e-2, "BF16": 3e-2}.get(qtype.name, 0.35)
        assert np.abs(values - array).max() <= tol * max(1.0, np.abs(array).max()), name


def test_a_file_of_float_tensors_needs_no_quant_scheme(tmp_path):
    import gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(1)
    tensors = {
        "blk.0.ffn_down.weight": (rng.standard_normal((64, 128)).astype(np.float32), Q.F16),
        "blk.0.attn_norm.weight": (rng.standard_normal((64,)).astype(np.float32), Q.F32),
    }
    path = gs.write_sentencepiece_gguf(tmp_path / "float.gguf", tensors=tensors)[0]
    assert GGUFFormat().load(str(path)).quantization is None


def test_split_shards_load_from_any_shard(written):
    tensors, single, shards = written
    assert len(shards) == 3  # six tensors, two per shard
    reference = {k: _values(v) for k, v in GGUFFormat().load(str(single)).tensors()}
    for shard in shards:
        assert GGUFFormat.claims(str(shard))
        ck = GGUFFormat().load(str(shard))
        assert ck.extra["gguf_files"] == [str(p) for p in shards]
        got = {k: _values(v) for k, v in ck.tensors()}
        assert set(got) == set(reference)
        for name in reference:
            np.testing.assert_array_equal(got[name], reference[name])
        assert ck.config["num_hidden_layers"] == 1
        assert "split.count" not in ck.extra["gguf_metadata"]


def test_missing_shard_is_named(written, tmp_path):
    _, _, shards = written
    import shutil

    copies = [shutil.copy(p, tmp_path / p.name) for p in shards[:2]]
    with pytest.raises(ModelFileError, match=r"tiny-split-00003-of-00003\.gguf"):
        GGUFFormat().load(copies[0])
    assert shard_paths(tmp_path / "plain.gguf") == [tmp_path / "plain.gguf"]


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        GGUFFormat().load(str(bad))
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        GGUFFormat().load(str(tmp_path / "missing.gguf"))


def test_synthetic_config(written):
    _, single, _ = written
    cfg = GGUFFormat().load(str(single)).config
    assert cfg["model_type"] == "llama"
    assert cfg["hidden_size"] == 64 and cfg["num_attention_heads"] == 4
    assert cfg["num_key_value_heads"] == 2 and cfg["head_dim"] == 16
    assert cfg["tie_word_embeddings"] is True  # no output.weight in the file
    assert cfg["vocab_size"] == len(gs.sentencepiece_vocab()[0])
    assert cfg["bos_token_id"] == 1 and cfg["eos_token_id"] == 2
    assert "partial_rotary_factor" not in cfg  # rope.dimension_count == head_dim
    assert cfg["torch_dtype"] == "bfloat16"


def test_checkpoint_states_tensor_shapes_without_reading_them(written):
    tensors, single, shards = written
    for source in (single, shards[1]):
        ck = GGUFFormat().load(str(source))
        assert ck.tensor_shapes == {name: array.shape for name, (array, _) in tensors.items()}
        assert ck.config_path == str(single if source == single else shards[0])


def _meta(**extra):
    base = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.embedding_length": 128,
        "llama.attention.head_count": 4,
        "tokenizer.ggml.tokens": ["a", "b", "c"],
    }
    return {**base, **extra}


def test_config_rope_scaling_and_window():
    cfg = config_from_metadata(
        _meta(
            **{
                "llama.rope.scaling.type": "yarn",
                "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.original_context_length": 8192,
                "llama.rope.freq_base": 5e5,
                "llama.attention.sliding_window": 4096,
                "llama.rope.dimension_count": 16,
                "llama.attention.key_length": 64,
            }
        ),
        ["output.weight"],
    )
    assert cfg["rope_scaling"] == {
        "rope_type": "yarn",
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert cfg["rope_parameters"] == {
        "rope_type": "yarn",
        "rope_theta": 5e5,
        "factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert cfg["sliding_window"] == 4096
    assert cfg["head_dim"] == 64 and cfg["partial_rotary_factor"] == 0.25
    assert cfg["num_key_value_heads"] == 4  # absent: as many as query heads
    assert cfg["vocab_size"] == 3 and cfg["tie_word_embeddings"] is False


def test_config_rope_scaling_none_and_legacy_linear():
    assert (
        config_from_metadata(_meta(**{"llama.rope.scaling.type": "none"}), [])["rope_scaling"]
        is None
    )
    assert config_from_metadata(_meta(**{"llama.rope.scale_linear": 2.0}), [])["rope_scaling"] == {
        "rope_type": "linear",
        "factor": 2.0,
    }


@pytest.mark.parametrize(
    "missing",
    [
        "general.architecture",
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
    ],
)
def test_config_names_a_missing_key(missing):
    meta = _meta()
    del meta[missing]
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        config_from_metadata(meta, [])


def test_torch_dtype_of():
    assert torch_dtype_of([("F32", 2), ("F32", 1)]) == "float32"
    assert torch_dtype_of([("F16", 2), ("F32", 1)]) == "float16"
    assert torch_dtype_of([("BF16", 2)]) == "bfloat16"
    assert torch_dtype_of([("Q4_K", 2), ("F32", 1)]) == "bfloat16"


def test_registered_target():
    """(Entry point and light registration: tests/test_conformance.py.)"""
    registry = WeightFormatRegistry()
    plugin.tallow_register_weight_formats(registry)
    assert registry.entry("gguf").target == "tallow_format_gguf.format:GGUFFormat"
