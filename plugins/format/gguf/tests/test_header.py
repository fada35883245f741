"""tallow-format-gguf's header reader against the ``gguf`` package's own reader (the oracle): the same
metadata values and the same tensor index, on files written with ``gguf.GGUFWriter`` and on the
real Qwen2.5-Coder GGUF; and the checks of metadata against tensors."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

import gguf_synthetic as gs
from tallow.plugin import ModelFileError
from tallow_format_gguf.consistency import check_metadata_against_tensors, check_vocabulary
from tallow_format_gguf.header import read_header
from tallow_format_gguf.reader import open_gguf


def oracle(path: pathlib.Path) -> tuple[dict[str, Any], list[Any]]:
    """Metadata (plain values) and tensors as ``gguf.GGUFReader`` reads them."""
    import gguf

    reader = gguf.GGUFReader(path)
    metadata = {}
    for name, f in reader.fields.items():
        if not name.startswith("GGUF."):
            value = f.contents()
            metadata[name] = value.item() if isinstance(value, np.generic) else value
    return metadata, reader.tensors


def assert_same_as_oracle(path: pathlib.Path) -> None:
    header = read_header(path)
    metadata, tensors = oracle(path)
    assert header.metadata.keys() == metadata.keys()
    for key, value in metadata.items():
        ours = header.metadata[key]
        if isinstance(value, float):
            assert ours == pytest.approx(value, rel=1e-7), key
        else:
            assert ours == value, key
        assert type(ours) is type(value) or isinstance(value, float), key
    assert list(header.tensors) == [t.name for t in tensors]
    for t in tensors:
        ours = header.tensors[t.name]
        assert ours.tensor_type == t.tensor_type, t.name
        assert list(ours.shape) == t.shape.tolist() and ours.n_elements == t.n_elements
        assert (ours.n_bytes, ours.data_offset) == (t.n_bytes, t.data_offset), t.name
        assert ours.data.dtype == t.data.dtype and ours.data.shape == t.data.shape, t.name
        np.testing.assert_array_equal(ours.data, t.data, err_msg=t.name)


def _every_value_type(writer: Any) -> None:
    import gguf

    V = gguf.GGUFValueType
    for kind, value in [
        (V.UINT8, 200),
        (V.INT8, -100),
        (V.UINT16, 60000),
        (V.INT16, -30000),
        (V.UINT32, 4_000_000_000),
        (V.INT32, -2_000_000_000),
        (V.UINT64, 2**63 + 7),
        (V.INT64, -(2**62)),
        (V.FLOAT32, 1.5),
        (V.FLOAT64, -2.25),
        (V.BOOL, True),
        (V.STRING, "ünïcödé ✓"),
    ]:
        writer.add_key_value(f"test.{kind.name.lower()}", value, kind)
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_array("test.floats", [0.5, 1.5])
    writer.add_array("test.bools", [True, False, True])
    writer.add_array("test.strings", ["a", "", "ccc"])


def test_metadata_of_every_type_reads_as_the_oracle_reads_it(tmp_path):
    import gguf

    path = tmp_path / "types.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    _every_value_type(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_as_oracle(path)
    meta = read_header(path).metadata
    assert meta["test.uint64"] == 2**63 + 7 and meta["test.bool"] is True
    assert meta["test.bools"] == [True, False, True]
    assert meta["test.string"] == "ünïcödé ✓" and meta["test.strings"] == ["a", "", "ccc"]


def test_tensors_read_as_the_oracle_reads_them(tmp_path):
    import gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(1)
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    # Q4_K as raw blocks (the gguf package cannot quantize to it): 144 bytes per 256 values
    writer.add_tensor("a", rng.integers(0, 255, (64, 144), dtype=np.uint8), raw_dtype=Q.Q4_K)
    writer.add_tensor("b", rng.standard_normal((3, 5, 7)).astype(np.float16))
    writer.add_tensor("c", rng.standard_normal(9).astype(np.float32))
    writer.add_tensor(
        "d",
        gguf.quants.quantize(rng.standard_normal((8, 64)).astype(np.float32), Q.Q8_0),
        raw_dtype=Q.Q8_0,
    )
    writer.add_tensor("e", rng.integers(-9, 9, (2, 4), dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_as_oracle(path)
    assert read_header(path).tensors["a"].shape == (256, 64)


def test_split_shards_read_as_the_oracle_reads_them(tmp_path):
    import gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(2)
    tensors = {
        f"blk.0.t{i}.weight": (rng.standard_normal((4, 32)).astype(np.float32), Q.Q8_0)
        for i in range(5)
    }
    shards = gs.write_sentencepiece_gguf(tmp_path / "s.gguf", tensors=tensors, split_max_tensors=2)
    for shard in shards:
        assert_same_as_oracle(shard)


@pytest.mark.slow
def test_the_real_model_reads_as_the_oracle_reads_it(qwen_gguf_file):
    """Metadata and all 291 tensor entries of Qwen2.5-Coder-0.5B, as gguf reads them."""
    assert_same_as_oracle(qwen_gguf_file)


# -- metadata against tensors ------------------------------------------------------------------
class _T:
    """A tensor index entry: only the shape matters here."""

    def __init__(self, name: str, *shape: int) -> None:
        self.name, self.shape = name, shape


def _tensors(
    blocks: int = 2,
    hidden: int = 64,
    q_rows: int = 64,
    k_rows: int = 32,
    ffn: int = 128,
    vocab: int = 10,
) -> dict[str, _T]:
    out = {"token_embd.weight": _T("token_embd.weight", hidden, vocab)}
    for i in range(blocks):
        for name, shape in (
            (f"blk.{i}.attn_q.weight", (hidden, q_rows)),
            (f"blk.{i}.attn_k.weight", (hidden, k_rows)),
            (f"blk.{i}.attn_v.weight", (hidden, k_rows)),
            (f"blk.{i}.ffn_up.weight", (hidden, ffn)),
        ):
            out[name] = _T(name, *shape)
    return out


def _meta(**extra: Any) -> dict[str, Any]:
    base = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.embedding_length": 64,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.feed_forward_length": 128,
        "tokenizer.ggml.tokens": list("abcdefghij"),
    }
    return {**base, **extra}


def test_consistent_metadata_passes():
    check_metadata_against_tensors(pathlib.Path("m.gguf"), _meta(), _tensors())
    # a family storing more Q rows than the heads need (a gate beside Q) is accepted
    check_metadata_against_tensors(pathlib.Path("m.gguf"), _meta(), _tensors(q_rows=128))
    # per-layer counts, one per block
    check_metadata_against_tensors(
        pathlib.Path("m.gguf"),
        _meta(**{"llama.attention.head_count_kv": [2, 2], "llama.feed_forward_length": [128, 64]}),
        _tensors(),
    )
    # a vocabulary-only file has nothing to compare
    check_metadata_against_tensors(
        pathlib.Path("m.gguf"), _meta(**{"llama.block_count": 10**9}), {}
    )


@pytest.mark.parametrize(
    "meta, tensors, match",
    [
        (
            _meta(**{"llama.block_count": 3}),
            _tensors(),
            r"'llama\.block_count': 3, but the file "
            r"holds tensors for 2 blocks",
        ),
        (
            _meta(),
            {k: v for k, v in _tensors().items() if not k.startswith("blk.0.")},
            r"no tensors for block 0",
        ),
        (_meta(**{"llama.embedding_length": 65}), _tensors(), r"'llama\.embedding_length': 65"),
        (
            _meta(**{"llama.vocab_size": 11}),
            _tensors(),
            r"'llama\.vocab_size': 11 tokens, but "
            r"tensor 'token_embd\.weight' has 10 rows",
        ),
        (_meta(**{"tokenizer.ggml.tokens": list("abc")}), _tensors(), r"'tokenizer\.ggml\.tokens'"),
        (_meta(**{"llama.attention.head_count": 3}), _tensors(), r"3 heads do not divide"),
        (
            _meta(**{"llama.attention.head_count": 8, "llama.attention.key_length": 16}),
            _tensors(),
            r"8 heads of 16 need 128 rows, but tensor 'blk\.0\.attn_q\.weight' has 64",
        ),
        (
            _meta(**{"llama.attention.head_count_kv": [2, 3]}),
            _tensors(),
            r"head_count_kv': 3 heads of 16 need 48 rows, but tensor 'blk\.1\.attn_k\.weight'",
        ),
        (_meta(**{"llama.attention.head_count_kv": [2]}), _tensors(), r"1 per-layer values for 2"),
        (_meta(**{"llama.feed_forward_length": 129}), _tensors(), r"feed_forward_length': 129"),
        (_meta(**{"llama.context_length": 2**40}), _tensors(), r"context_length"),
        (_meta(**{"llama.block_count": True}), _tensors(), r"True is not an integer"),
    ],
)
def test_inconsistent_metadata_names_the_key(meta, tensors, match):
    with pytest.raises(ModelFileError, match=match) as info:
        check_metadata_against_tensors(pathlib.Path("m.gguf"), meta, tensors)
    assert info.value.path == "m.gguf"


@pytest.mark.parametrize(
    "meta, match",
    [
        ({"tokenizer.ggml.tokens": "abc"}, r"'tokenizer\.ggml\.tokens': a str; expected a list"),
        ({"tokenizer.ggml.tokens": ["a", 7]}, r"item 1 is 7; expected strings"),
        (
            {"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.token_type": [1, True]},
            r"'tokenizer\.ggml\.token_type': item 1 is True",
        ),
        (
            {"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.scores": [0.5]},
            r"'tokenizer\.ggml\.scores': 1 entries for 2 tokens",
        ),
        ({"tokenizer.ggml.merges": ["a b", None]}, r"'tokenizer\.ggml\.merges': item 1 is None"),
    ],
)
def test_damaged_vocabulary_names_the_key(meta, match):
    with pytest.raises(ModelFileError, match=match):
        check_vocabulary(pathlib.Path("m.gguf"), meta)
    check_vocabulary(
        pathlib.Path("m.gguf"),
        {
            "tokenizer.ggml.tokens": ["a", "b"],
            "tokenizer.ggml.scores": [0, -1.5],
            "tokenizer.ggml.token_type": [1, 3],
        },
    )


def _split_blocks(path: pathlib.Path, block_count: int) -> list[pathlib.Path]:
    """Two blocks' norms in two shards, under a declared ``block_count``."""
    import gguf

    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=1)
    writer.add_uint32("llama.block_count", block_count)
    writer.add_uint32("llama.embedding_length", 64)
    writer.add_uint32("llama.attention.head_count", 4)
    for i in range(2):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, np.float32))
    paths = [pathlib.Path(p) for p in writer.format_shard_names(path)]
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return paths


def test_a_split_model_is_checked_as_a_whole(tmp_path):
    """The blocks are spread over the shards: the count holds for the set, not each file."""
    shards = _split_blocks(tmp_path / "ok.gguf", 2)
    assert len(shards) == 2
    model = open_gguf(shards[1])
    assert set(model.tensors) == {"blk.0.attn_norm.weight", "blk.1.attn_norm.weight"}
    bad = _split_blocks(tmp_path / "bad.gguf", 3)
    with pytest.raises(
        ModelFileError,
        match=r"bad-00001-of-00002\.gguf: metadata "
        r"'llama\.block_count': 3, but",
    ):
        open_gguf(bad[1])
