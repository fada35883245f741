"""A corpus of damaged model files, made from two tiny intact models.

The intact models are a ``llama`` GGUF written with ``gguf.GGUFWriter`` and a Hugging Face
directory (``config.json`` + ``model.safetensors``). The GGUF fields to damage are located with
the ``gguf`` package's own reader on the intact file (:class:`GGUFLayout`). Each case names
the damage, the file at fault and what the error must say (besides the file's path).
"""

from __future__ import annotations

import json
import pathlib
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

import gguf
import numpy as np

HIDDEN, FFN, HEADS, KV_HEADS, BLOCKS, CONTEXT = 32, 64, 2, 1, 2, 256
HEAD_DIM = HIDDEN // HEADS
#: a corrupt 32-bit count: 24 with its top byte flipped (the value of issue item 5)
FLIPPED_24 = 4_278_190_104


# ---------------------------------------------------------------------------------------------
# The intact models
# ---------------------------------------------------------------------------------------------
def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: ``<unk> <s> </s>``, the 256 byte tokens, a few pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    for piece in ("▁a", "▁b", "▁the", "▁model", "▁file", "ab", "he"):
        tokens.append(piece)
        types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, scores, types


def _tensors(rng: np.random.Generator, n_vocab: int) -> dict[str, tuple[np.ndarray, Any]]:
    """Llama-layout tensors (torch order) with their GGML types; no ``output.weight`` (tied)."""
    Q = gguf.GGMLQuantizationType

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out: dict[str, tuple[np.ndarray, Any]] = {"token_embd.weight": (w(n_vocab, HIDDEN), Q.Q8_0)}
    for i in range(BLOCKS):
        out |= {
            f"blk.{i}.attn_norm.weight": (w(HIDDEN) + 1, Q.F32),
            f"blk.{i}.attn_q.weight": (w(HEADS * HEAD_DIM, HIDDEN), Q.Q8_0),
            f"blk.{i}.attn_k.weight": (w(KV_HEADS * HEAD_DIM, HIDDEN), Q.F16),
            f"blk.{i}.attn_v.weight": (w(KV_HEADS * HEAD_DIM, HIDDEN), Q.F16),
            f"blk.{i}.attn_output.weight": (w(HIDDEN, HEADS * HEAD_DIM), Q.Q8_0),
            f"blk.{i}.ffn_norm.weight": (w(HIDDEN) + 1, Q.F32),
            f"blk.{i}.ffn_gate.weight": (w(FFN, HIDDEN), Q.Q8_0),
            f"blk.{i}.ffn_up.weight": (w(FFN, HIDDEN), Q.Q8_0),
            f"blk.{i}.ffn_down.weight": (w(HIDDEN, FFN), Q.F16),
        }
    out["output_norm.weight"] = (w(HIDDEN) + 1, Q.F32)
    return out


def write_gguf(
    path: pathlib.Path,
    *,
    tokens_cut: int = 0,
    extra: Callable[[Any], None] | None = None,
    skip: tuple[str, ...] = (),
    tensors: bool = True,
    split_max_tensors: int = 0,
) -> list[pathlib.Path]:
    """The intact tiny ``llama`` GGUF (or a variant): ``tokens_cut`` drops tokens from the end of
    the vocabulary, ``extra(writer)`` adds metadata, ``skip`` leaves metadata keys out."""
    tokens, scores, types = vocabulary()
    if tokens_cut:
        tokens, scores, types = tokens[:-tokens_cut], scores[:-tokens_cut], types[:-tokens_cut]
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    if "general.architecture" in skip:
        writer.kv_data[0].pop("general.architecture")

    def put(key: str, add: Callable[[str, Any], None], value: Any) -> None:
        if key not in skip:
            add(key, value)

    writer.add_name("tallow corpus")
    writer.add_custom_alignment(32)
    put("llama.block_count", writer.add_uint32, BLOCKS)
    put("llama.context_length", writer.add_uint32, CONTEXT)
    put("llama.embedding_length", writer.add_uint32, HIDDEN)
    put("llama.feed_forward_length", writer.add_uint32, FFN)
    put("llama.attention.head_count", writer.add_uint32, HEADS)
    put("llama.attention.head_count_kv", writer.add_uint32, KV_HEADS)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_uint32("llama.rope.dimension_count", HEAD_DIM)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if extra is not None:
        extra(writer)
    if tensors:
        n_vocab = len(vocabulary()[0])  # the embedding keeps every row, whatever the cut
        for name, (array, qtype) in _tensors(np.random.default_rng(0), n_vocab).items():
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    paths = writer.format_shard_names(path) if split_max_tensors else [path]
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [pathlib.Path(p) for p in paths]


HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": FFN,
    "num_hidden_layers": BLOCKS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "vocab_size": 64,
    "max_position_embeddings": CONTEXT,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def hf_tensors() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)

    def w(*shape: int, dtype: Any = torch.float32) -> Any:
        return (torch.randn(*shape, generator=g) * 0.2).to(dtype)

    out = {
        "model.embed_tokens.weight": w(64, HIDDEN),
        "model.norm.weight": w(HIDDEN) + 1,
        "lm_head.weight": w(64, HIDDEN, dtype=torch.bfloat16),
    }
    for i in range(BLOCKS):
        p = f"model.layers.{i}"
        out |= {
            f"{p}.input_layernorm.weight": w(HIDDEN) + 1,
            f"{p}.post_attention_layernorm.weight": w(HIDDEN) + 1,
            f"{p}.self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN, dtype=torch.float16),
            f"{p}.self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
            f"{p}.mlp.gate_proj.weight": w(FFN, HIDDEN),
            f"{p}.mlp.up_proj.weight": w(FFN, HIDDEN),
            f"{p}.mlp.down_proj.weight": w(HIDDEN, FFN),
        }
    return out


def write_hf_dir(
    root: pathlib.Path, *, config: dict[str, Any] | None = None, shards: int = 1
) -> pathlib.Path:
    """The intact tiny Hugging Face directory (``shards`` > 1: with an index)."""
    from safetensors.torch import save_file

    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config or HF_CONFIG))
    tensors = hf_tensors()
    if shards == 1:
        save_file(tensors, str(root / "model.safetensors"))
        return root
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::shards]}
        save_file(part, str(root / file))
        weight_map |= dict.fromkeys(part, file)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


# ---------------------------------------------------------------------------------------------
# Where the fields of the intact GGUF are
# ---------------------------------------------------------------------------------------------
@dataclass
class GGUFLayout:
    """Byte offsets in the intact GGUF, read with ``gguf.GGUFReader`` (the oracle)."""

    data: bytes
    kv: dict[str, int] = field(default_factory=dict)  # key -> offset of its key length
    values: dict[str, int] = field(default_factory=dict)  # key -> offset of its value
    tensor_info: dict[str, int] = field(default_factory=dict)  # name -> offset of its name length
    data_start: int = 0

    @classmethod
    def of(cls, path: pathlib.Path) -> "GGUFLayout":
        reader = gguf.GGUFReader(path)
        layout = cls(path.read_bytes(), data_start=reader.data_offset)
        for name, f in reader.fields.items():
            if name.startswith("GGUF."):
                continue
            layout.kv[name] = f.offset
            layout.values[name] = f.offset + 8 + len(name.encode()) + 4
        for t in reader.tensors:
            layout.tensor_info[t.name] = t.field.offset
        return layout

    def tensor_field(self, name: str, part: str, dim: int = 0) -> int:
        """Offset of ``part`` (n_dims, dim, type, offset) of tensor ``name``'s index entry."""
        at = self.tensor_info[name] + 8 + len(name.encode())
        n_dims = struct.unpack_from("<I", self.data, at)[0]
        return {
            "n_dims": at,
            "dim": at + 4 + 8 * dim,
            "type": at + 4 + 8 * n_dims,
            "offset": at + 4 + 8 * n_dims + 4,
        }[part]


def put_value(data: bytes, at: int, fmt: str, value: Any) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def xor_byte(data: bytes, at: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[at] ^= mask
    return bytes(out)


# -- damage to the intact GGUF, described by where and what ------------------------------------
Where = Callable[[GGUFLayout], int]
Damage = Callable[[GGUFLayout, bytes], bytes]


def byte(n: int) -> Where:
    return lambda L: n


def key(name: str, plus: int = 0) -> Where:
    """The metadata entry ``name`` (its key length, or ``plus`` bytes on)."""
    return lambda L: L.kv[name] + plus


def value(name: str, plus: int = 0) -> Where:
    """The value of metadata entry ``name`` (or ``plus`` bytes on; -4 is its value type)."""
    return lambda L: L.values[name] + plus


def tensor(name: str, part: str, dim: int = 0) -> Where:
    """A field of tensor ``name``'s index entry: name, n_dims, dim, type or offset."""
    return lambda L: L.tensor_info[name] if part == "name" else L.tensor_field(name, part, dim)


def write(where: Where, fmt: str, new: int | Callable[[int, GGUFLayout], int]) -> Damage:
    """Overwrite the field at ``where`` with ``new`` (or ``new(old value, layout)``)."""

    def damage(L: GGUFLayout, data: bytes) -> bytes:
        offset = where(L)
        number = new(struct.unpack_from(fmt, data, offset)[0], L) if callable(new) else new
        return put_value(data, offset, fmt, number)

    return damage


def flip(where: Where, mask: int = 0xFF) -> Damage:
    return lambda L, data: xor_byte(data, where(L), mask)


def cut(where: Where) -> Damage:
    """The file truncated at ``where``."""
    return lambda L, data: data[: where(L)]


def both(first: Damage, second: Damage) -> Damage:
    return lambda L, data: second(L, first(L, data))


def plus(n: int) -> Callable[[int, GGUFLayout], int]:
    return lambda old, L: old + n


def offset_of(name: str) -> Callable[[int, GGUFLayout], int]:
    """The data offset of tensor ``name``: another tensor moved onto it."""
    return lambda old, L: struct.unpack_from("<Q", L.data, L.tensor_field(name, "offset"))[0]


# ---------------------------------------------------------------------------------------------
# The corpus: id -> (how to make the damaged file from the intact one, what the error names)
# ---------------------------------------------------------------------------------------------
Q_W, K_W, V1_W = "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.1.attn_v.weight"

#: GGUF cases as (id, damage, fragments the message must contain besides the file's path)
GGUF_BYTE_CASES: list[tuple[str, Damage, tuple[str, ...]]] = [
    ("empty", cut(byte(0)), ("too short",)),
    ("magic", flip(byte(0)), ("magic",)),
    ("version", write(byte(4), "<I", 99), ("version", "99")),
    ("version-1", write(byte(4), "<I", 1), ("version", "1")),
    ("big-endian", write(byte(4), ">I", 3), ("big-endian",)),
    ("tensor-count-huge", write(byte(8), "<Q", 2**63 + 5), ("tensor_count",)),
    ("tensor-count-flipped", flip(byte(8 + 3)), ("tensor_count",)),
    ("tensor-count-plus-one", write(byte(8), "<Q", plus(1)), ()),
    ("kv-count-huge", write(byte(16), "<Q", 2**40), ("kv_count",)),
    ("kv-count-plus-one", write(byte(16), "<Q", plus(1)), ()),
    ("kv-count-minus-one", write(byte(16), "<Q", plus(-1)), ()),
    ("key-length-huge", write(key("general.name"), "<Q", 2**40), ("metadata key",)),
    ("key-length-shifted", write(key("general.name"), "<Q", plus(3)), ()),
    ("key-not-utf8", flip(key("llama.context_length", 8), 0x80), ("UTF-8",)),
    (
        "value-type-unknown",
        write(value("llama.context_length", -4), "<I", 77),
        ("llama.context_length", "77"),
    ),
    (
        "string-length-huge",
        write(value("general.architecture"), "<Q", 2**62),
        ("general.architecture",),
    ),
    (
        "array-length-huge",
        write(value("tokenizer.ggml.tokens", 4), "<Q", 2**40),
        ("tokenizer.ggml.tokens",),
    ),
    (
        "array-length-flipped",
        flip(value("tokenizer.ggml.scores", 4 + 3)),
        ("tokenizer.ggml.scores",),
    ),
    (
        "array-item-type-unknown",
        write(value("tokenizer.ggml.token_type"), "<I", 40),
        ("tokenizer.ggml.token_type",),
    ),
    (
        "array-string-length-huge",
        write(value("tokenizer.ggml.tokens", 12), "<Q", 2**50),
        ("tokenizer.ggml.tokens",),
    ),
    ("alignment-zero", write(value("general.alignment"), "<I", 0), ("general.alignment",)),
    ("alignment-odd", write(value("general.alignment"), "<I", 48), ("general.alignment",)),
    ("alignment-huge", write(value("general.alignment"), "<I", 1 << 31), ("aligned",)),
    ("tensor-name-length-huge", write(tensor(Q_W, "name"), "<Q", 2**45), ("tensor",)),
    ("tensor-n-dims", write(tensor(Q_W, "n_dims"), "<I", 99), (Q_W, "99")),
    (
        "tensor-dim-zero",
        write(tensor("blk.0.ffn_up.weight", "dim", 1), "<Q", 0),
        ("blk.0.ffn_up.weight",),
    ),
    (
        "tensor-dim-huge",
        write(tensor("blk.1.ffn_down.weight", "dim", 1), "<Q", 2**40),
        ("blk.1.ffn_down.weight",),
    ),
    (
        "tensor-dims-overflow",
        both(
            write(tensor("token_embd.weight", "dim", 0), "<Q", 2**63),
            write(tensor("token_embd.weight", "dim", 1), "<Q", 2**63),
        ),
        ("token_embd.weight",),
    ),
    (
        "tensor-row-not-whole-blocks",
        write(tensor("blk.0.ffn_gate.weight", "dim", 0), "<Q", 33),
        ("blk.0.ffn_gate.weight", "block"),
    ),
    ("tensor-type-unknown", write(tensor(K_W, "type"), "<I", 99), (K_W, "99")),
    ("tensor-type-removed", write(tensor(K_W, "type"), "<I", 4), (K_W,)),
    ("tensor-offset-huge", write(tensor(V1_W, "offset"), "<Q", 2**50), (V1_W,)),
    ("tensor-offset-misaligned", write(tensor(V1_W, "offset"), "<Q", plus(1)), (V1_W, "align")),
    (
        "tensor-offset-overlap",
        write(tensor(V1_W, "offset"), "<Q", offset_of("blk.1.attn_k.weight")),
        ("overlap",),
    ),
    ("truncated-in-header", cut(byte(20)), ("truncated",)),
    ("truncated-in-metadata", cut(value("tokenizer.ggml.tokens", 300)), ("truncated",)),
    ("truncated-in-tensor-index", cut(tensor("blk.1.ffn_up.weight", "name")), ("truncated",)),
    ("truncated-at-data", cut(lambda L: L.data_start), ("truncated",)),
    ("truncated-in-data", cut(lambda L: (L.data_start + len(L.data)) // 2), ("truncated",)),
    ("truncated-last-byte", cut(lambda L: len(L.data) - 1), ("truncated",)),
    (
        "block-count-flipped",
        write(value("llama.block_count"), "<I", FLIPPED_24),
        ("llama.block_count", "4278190104"),
    ),
    (
        "block-count-plus-one",
        write(value("llama.block_count"), "<I", plus(1)),
        ("llama.block_count",),
    ),
    (
        "block-count-minus-one",
        write(value("llama.block_count"), "<I", plus(-1)),
        ("llama.block_count",),
    ),
    ("block-count-zero", write(value("llama.block_count"), "<I", 0), ("llama.block_count",)),
    (
        "embedding-length-flipped",
        flip(value("llama.embedding_length", 3)),
        ("llama.embedding_length",),
    ),
    (
        "head-count-flipped",
        flip(value("llama.attention.head_count", 3)),
        ("llama.attention.head_count",),
    ),
    (
        "head-count-zero",
        write(value("llama.attention.head_count"), "<I", 0),
        ("llama.attention.head_count",),
    ),
    (
        "head-count-kv-flipped",
        flip(value("llama.attention.head_count_kv", 3)),
        ("llama.attention.head_count_kv",),
    ),
    (
        "feed-forward-flipped",
        flip(value("llama.feed_forward_length", 3)),
        ("llama.feed_forward_length",),
    ),
    ("context-length-flipped", flip(value("llama.context_length", 3)), ("llama.context_length",)),
    (
        "architecture-renamed-key",
        flip(key("general.architecture", 8 + 2), 0x20),
        ("general.architecture",),
    ),
]


def _duplicate_key(writer: Any) -> None:
    writer.add_string("general.namf", "a second name")  # renamed to general.name below


def _block_count_string(writer: Any) -> None:
    writer.kv_data[0].pop("llama.block_count")
    writer.add_string("llama.block_count", "2")


#: GGUF files written on purpose: (id, write(path) -> (source, file at fault), fragments)
GGUF_WRITTEN_CASES: list[
    tuple[str, Callable[[pathlib.Path], tuple[pathlib.Path, pathlib.Path]], tuple[str, ...]]
] = [
    (
        "vocab-shorter-than-embedding",
        lambda p: _same(write_gguf(p, tokens_cut=3)[0]),
        ("tokenizer.ggml.tokens", "token_embd.weight"),
    ),
    (
        "no-architecture",
        lambda p: _same(write_gguf(p, skip=("general.architecture",))[0]),
        ("general.architecture",),
    ),
    (
        "no-block-count",
        lambda p: _same(write_gguf(p, skip=("llama.block_count",))[0]),
        ("llama.block_count",),
    ),
    (
        "no-embedding-length",
        lambda p: _same(write_gguf(p, skip=("llama.embedding_length",))[0]),
        ("llama.embedding_length",),
    ),
    (
        "block-count-is-a-string",
        lambda p: _same(write_gguf(p, extra=_block_count_string)[0]),
        ("llama.block_count",),
    ),
    (
        "duplicate-key",
        lambda p: _same(
            _rename(write_gguf(p, extra=_duplicate_key)[0], b"general.namf", b"general.name")
        ),
        ("general.name",),
    ),
    (
        "duplicate-tensor",
        lambda p: _same(
            _rename(write_gguf(p)[0], b"blk.1.ffn_norm.weight", b"blk.0.ffn_norm.weight")
        ),
        ("blk.0.ffn_norm.weight",),
    ),
    ("vocabulary-only", lambda p: _same(write_gguf(p, tensors=False)[0]), ("no tensors",)),
    (
        "tokens-not-strings",
        lambda p: _same(
            write_gguf(
                p, extra=_replace("tokenizer.ggml.tokens", list(range(len(vocabulary()[0]))))
            )[0]
        ),
        ("tokenizer.ggml.tokens", "item 0 is 0"),
    ),
    (
        "token-types-short",
        lambda p: _same(write_gguf(p, extra=_replace("tokenizer.ggml.token_type", [1] * 10))[0]),
        ("tokenizer.ggml.token_type", "10 entries"),
    ),
    (
        "token-types-not-ints",
        lambda p: _same(
            write_gguf(
                p, extra=_replace("tokenizer.ggml.token_type", ["x"] * len(vocabulary()[0]))
            )[0]
        ),
        ("tokenizer.ggml.token_type",),
    ),
    (
        "merges-not-strings",
        lambda p: _same(write_gguf(p, extra=_replace("tokenizer.ggml.merges", [1, 2]))[0]),
        ("tokenizer.ggml.merges",),
    ),
    (
        "shard-truncated",
        lambda p: _truncate_shard(write_gguf(p, split_max_tensors=8), 1),
        ("truncated",),
    ),
]


def _replace(key: str, items: list[Any]) -> Callable[[Any], None]:
    def extra(writer: Any) -> None:
        writer.kv_data[0].pop(key, None)
        writer.add_array(key, items)

    return extra


def _same(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    return path, path


def _rename(path: pathlib.Path, old: bytes, new: bytes) -> pathlib.Path:
    data = path.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    path.write_bytes(data.replace(old, new))
    return path


def _truncate_shard(paths: list[pathlib.Path], index: int) -> tuple[pathlib.Path, pathlib.Path]:
    """Cut the end off shard ``index``; the model is opened through the first shard."""
    victim = paths[index]
    victim.write_bytes(victim.read_bytes()[:-7])
    return paths[0], victim


# -- safetensors -------------------------------------------------------------------------------
def _split_safetensors(data: bytes) -> tuple[dict[str, Any], bytes]:
    n = struct.unpack_from("<Q", data)[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join_safetensors(header: dict[str, Any], body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def _edit_header(edit: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        header, body = _split_safetensors(data)
        edit(header)
        return _join_safetensors(header, body)

    return damage


def _set(name: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(header: dict[str, Any]) -> None:
        header[name][key] = value

    return edit


def _spans(header: dict[str, Any]) -> dict[str, list[int]]:
    return {k: v["data_offsets"] for k, v in header.items() if k != "__metadata__"}


def _overlap(header: dict[str, Any]) -> None:
    # the second tensor by offset starts inside the first (same size, shifted by 4 bytes)
    first, second = sorted(_spans(header).items(), key=lambda kv: kv[1][0])[:2]
    length = second[1][1] - second[1][0]
    header[second[0]]["data_offsets"] = [first[1][0] + 4, first[1][0] + 4 + length]


def _hole(header: dict[str, Any]) -> None:
    # the last tensor moved 8 bytes on (the file grows by 8): a gap before it
    last = max(_spans(header).items(), key=lambda kv: kv[1][0])
    header[last[0]]["data_offsets"] = [last[1][0] + 8, last[1][1] + 8]


#: safetensors cases: (id, damage(model.safetensors bytes) -> bytes, fragments)
ST_FILE_CASES: list[tuple[str, Callable[[bytes], bytes], tuple[str, ...]]] = [
    ("st-empty", lambda d: b"", ("too short",)),
    ("st-truncated-in-length", lambda d: d[:5], ("too short",)),
    ("st-header-length-huge", lambda d: put_value(d, 0, "<Q", 2**62), ("header",)),
    ("st-header-length-past-end", lambda d: put_value(d, 0, "<Q", len(d)), ("header", "truncated")),
    (
        "st-header-length-short",
        lambda d: put_value(d, 0, "<Q", struct.unpack_from("<Q", d)[0] - 9),
        ("JSON",),
    ),
    ("st-header-not-json", lambda d: xor_byte(d, 8, 0x55), ("JSON",)),
    ("st-header-not-utf8", lambda d: xor_byte(d, 10, 0x80), ("header",)),
    ("st-header-a-list", lambda d: struct.pack("<Q", 8) + b"[]      ", ("header",)),
    ("st-truncated-in-header", lambda d: d[:40], ("truncated",)),
    ("st-truncated-in-data", lambda d: d[:-100], ("truncated",)),
    ("st-trailing-bytes", lambda d: d + b"\0" * 64, ("bytes",)),
    (
        "st-dtype-unknown",
        _edit_header(_set("model.norm.weight", "dtype", "F17")),
        ("model.norm.weight", "F17"),
    ),
    (
        "st-dtype-missing",
        _edit_header(lambda h: h["model.norm.weight"].pop("dtype")),
        ("model.norm.weight", "dtype"),
    ),
    (
        "st-shape-wrong",
        _edit_header(_set("model.layers.0.mlp.up_proj.weight", "shape", [64, 33])),
        ("model.layers.0.mlp.up_proj.weight", "shape"),
    ),
    (
        "st-shape-negative",
        _edit_header(_set("model.norm.weight", "shape", [-32])),
        ("model.norm.weight", "shape"),
    ),
    (
        "st-shape-huge",
        _edit_header(_set("model.norm.weight", "shape", [2**62, 2**62])),
        ("model.norm.weight",),
    ),
    (
        "st-shape-not-a-list",
        _edit_header(_set("model.norm.weight", "shape", "32")),
        ("model.norm.weight", "shape"),
    ),
    (
        "st-offsets-out-of-range",
        _edit_header(_set("model.norm.weight", "data_offsets", [0, 2**40])),
        ("model.norm.weight",),
    ),
    (
        "st-offsets-reversed",
        _edit_header(
            lambda h: h["model.norm.weight"].__setitem__(
                "data_offsets", h["model.norm.weight"]["data_offsets"][::-1]
            )
        ),
        ("model.norm.weight",),
    ),
    (
        "st-offsets-not-ints",
        _edit_header(_set("model.norm.weight", "data_offsets", ["0", 1.5])),
        ("model.norm.weight", "data_offsets"),
    ),
    ("st-offsets-overlap", _edit_header(_overlap), ("overlap",)),
    ("st-offsets-hole", lambda d: _edit_header(_hole)(d) + bytes(8), ("unused",)),
    (
        "st-metadata-not-strings",
        _edit_header(lambda h: h.__setitem__("__metadata__", {"format": 3})),
        ("__metadata__",),
    ),
    (
        "st-entry-not-an-object",
        _edit_header(lambda h: h.__setitem__("model.norm.weight", 5)),
        ("model.norm.weight",),
    ),
]


def _config_edit(**changes: Any) -> Callable[[pathlib.Path], None]:
    def edit(root: pathlib.Path) -> None:
        (root / "config.json").write_text(json.dumps({**HF_CONFIG, **changes}))

    return edit


def _index_names_absent_tensor(root: pathlib.Path) -> None:
    index = json.loads((root / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.7.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    (root / "model.safetensors.index.json").write_text(json.dumps(index))


#: whole-directory cases: (id, shards, edit(root), the file at fault, fragments)
ST_DIR_CASES: list[tuple[str, int, Callable[[pathlib.Path], None], str, tuple[str, ...]]] = [
    (
        "cfg-layers-flipped",
        1,
        _config_edit(num_hidden_layers=FLIPPED_24),
        "config.json",
        ("num_hidden_layers", "4278190104"),
    ),
    ("cfg-hidden-huge", 1, _config_edit(hidden_size=2**31), "config.json", ("hidden_size",)),
    ("cfg-vocab-huge", 1, _config_edit(vocab_size=2**40), "config.json", ("vocab_size",)),
    (
        "cfg-not-json",
        1,
        lambda r: (r / "config.json").write_text('{"hidden_size": 3'),
        "config.json",
        ("JSON",),
    ),
    (
        "index-names-absent-tensor",
        2,
        _index_names_absent_tensor,
        "model.safetensors.index.json",
        ("model.layers.7.mlp.up_proj.weight",),
    ),
]


@dataclass
class Case:
    id: str
    source: str  # what the loader is given
    at_fault: str  # the path the error must name
    fragments: tuple[str, ...]
    size: int  # bytes of the model's files (the memory budget)


def build_corpus(root: pathlib.Path) -> tuple[list[str], list[Case]]:
    """Write the intact models and every damaged one under ``root``."""
    intact_gguf = write_gguf(root / "intact.gguf")[0]
    intact_dir = write_hf_dir(root / "intact-hf")
    layout = GGUFLayout.of(intact_gguf)
    cases: list[Case] = []
    for case_id, damage, fragments in GGUF_BYTE_CASES:
        path = root / f"{case_id}.gguf"
        path.write_bytes(damage(layout, layout.data))
        cases.append(Case(case_id, str(path), str(path), fragments, len(layout.data)))
    for case_id, write, fragments in GGUF_WRITTEN_CASES:
        source, at_fault = write(root / f"{case_id}.gguf")
        size = sum(f.stat().st_size for f in root.glob(f"{case_id}*.gguf"))
        cases.append(Case(case_id, str(source), str(at_fault), fragments, size))
    intact_st = (intact_dir / "model.safetensors").read_bytes()
    for case_id, damage, fragments in ST_FILE_CASES:
        model = write_hf_dir(root / case_id)
        (model / "model.safetensors").write_bytes(damage(intact_st))
        cases.append(
            Case(
                case_id,
                str(model),
                str(model / "model.safetensors"),
                fragments,
                (model / "model.safetensors").stat().st_size,
            )
        )
    for case_id, shards, edit, at_fault, fragments in ST_DIR_CASES:
        model = write_hf_dir(root / case_id, shards=shards)
        edit(model)
        size = sum(f.stat().st_size for f in model.iterdir())
        cases.append(Case(case_id, str(model), str(model / at_fault), fragments, size))
    return [str(intact_gguf), str(intact_dir)], cases


CASE_IDS = (
    [c[0] for c in GGUF_BYTE_CASES]
    + [c[0] for c in GGUF_WRITTEN_CASES]
    + [c[0] for c in ST_FILE_CASES]
    + [c[0] for c in ST_DIR_CASES]
)
