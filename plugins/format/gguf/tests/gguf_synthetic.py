"""Small GGUF files written with ``gguf.GGUFWriter`` for tests: trained vocabularies (byte-level
and SentencePiece-style) and a few quantized tensors, optionally split into shards."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "Tokenizers split text into pieces; models read the pieces. 12345 67890 3.14159",
    "Hello world! Hello tallow. Bonjour le monde, ça va? Über naïve café.",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tcontinue\n",
    "I'm sure they're here, we've seen it, you'll see, he'd know.",
] * 4

#: Texts every tokenizer test encodes: spaces, scripts, emoji, code, special-token spellings.
TEXTS = [
    "Hello world",
    "  two leading spaces",
    "trailing spaces  ",
    "emoji 🎉👩‍👩‍👧 and 日本語のテキスト ü é",
    "tabs\tand\nnew\n\nlines\r\n",
    "def add(a, b):\n    return a + b\n",
    "<s> literal </s> special <unk>",
    "<|im_start|>user\nhi<|im_end|><tool_call>{}</tool_call>",
    "",
    " ",
    "12345678 digits 3.14159",
    "I'm HERE, they'RE we've",
    "\u00a0nbsp  \t ",
    "ÀÉÎõü Ωμέγα кириллица",
]

#: Control tokens of the byte-level vocabulary (Qwen-like spellings).
BYTE_LEVEL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_LEVEL_USER = ["<tool_call>", "</tool_call>"]

# gguf.TokenType values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def train_byte_level(vocab_size: int = 600) -> tuple[list[str], list[str]]:
    """A byte-level BPE trained on :data:`CORPUS`: ``(tokens in id order, merges)``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return [t for t, _ in vocab], merges


def train_sentencepiece(vocab_size: int = 400) -> list[tuple[str, float]]:
    """A SentencePiece-style BPE vocabulary (``▁`` for spaces) with merge-rank scores."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    # SentencePiece scores: later (rarer) pieces score lower.
    return [(t, -float(i)) for t, i in vocab]


def _base_metadata(writer: Any, arch: str, n_vocab: int) -> None:
    writer.add_name("tallow synthetic")
    writer.add_uint32(f"{arch}.block_count", 1)
    writer.add_uint32(f"{arch}.context_length", 256)
    writer.add_uint32(f"{arch}.embedding_length", 64)
    writer.add_uint32(f"{arch}.feed_forward_length", 128)
    writer.add_uint32(f"{arch}.attention.head_count", 4)
    writer.add_uint32(f"{arch}.attention.head_count_kv", 2)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_uint32(f"{arch}.rope.dimension_count", 16)


def write_byte_level_gguf(
    path: pathlib.Path, pre: str | None, *, arch: str = "llama", chat_template: str | None = None
) -> pathlib.Path:
    """A tensor-less GGUF with a trained byte-level vocabulary and ``tokenizer.ggml.pre`` (none
    when ``pre`` is ``None``)."""
    import gguf

    tokens, merges = train_byte_level()
    tokens = tokens + BYTE_LEVEL_SPECIALS + BYTE_LEVEL_USER
    types = (
        [NORMAL] * (len(tokens) - len(BYTE_LEVEL_SPECIALS) - len(BYTE_LEVEL_USER))
        + [CONTROL] * len(BYTE_LEVEL_SPECIALS)
        + [USER_DEFINED] * len(BYTE_LEVEL_USER)
    )
    writer = gguf.GGUFWriter(path, arch)
    _base_metadata(writer, arch, len(tokens))
    writer.add_tokenizer_model("gpt2")
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sentencepiece_vocab() -> tuple[list[str], list[float], list[int]]:
    """``<unk> <s> </s>``, the 256 byte tokens, then trained pieces: tokens, scores, types."""
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [UNKNOWN, CONTROL, CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(BYTE)
    for piece, score in train_sentencepiece():
        tokens.append(piece)
        scores.append(score)
        types.append(NORMAL)
    return tokens, scores, types


def write_sentencepiece_gguf(
    path: pathlib.Path,
    *,
    tensors: dict[str, tuple[np.ndarray, Any]] | None = None,
    split_max_tensors: int = 0,
    tie_embeddings: bool = True,
) -> list[pathlib.Path]:
    """A ``llama`` GGUF with a SentencePiece-style vocabulary and optional tensors.

    ``tensors`` maps a name to ``(float32 array in torch order, GGMLQuantizationType)``; each is
    quantized with the gguf package. Returns the written files (several when split).
    """
    import gguf

    tokens, scores, types = sentencepiece_vocab()
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    _base_metadata(writer, "llama", len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for name, (array, qtype) in (tensors or {}).items():
        data = gguf.quants.quantize(array, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)
    if not tie_embeddings and tensors is not None and "output.weight" not in tensors:
        raise ValueError("tie_embeddings=False needs an output.weight tensor")
    paths = writer.format_shard_names(path) if split_max_tensors else [path]
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [pathlib.Path(p) for p in paths]
