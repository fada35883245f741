"""The counts in a GGUF's metadata against the tensors the file holds.

A model is built from the metadata — ``<arch>.block_count`` layers of ``embedding_length``
wide, ``attention.head_count`` heads — before any tensor is read. A corrupt count would be
allocated as it stands (a flipped byte in ``block_count`` asked for 4,278,190,104 layers), so
each count that sizes the model is compared here with the tensor index, whose shapes are
already known to fit in the file. llama.cpp's tensor names are the same in every architecture
(``token_embd``, ``blk.<i>.attn_q``, ...), so one set of rules serves them all; where a family
may legitimately store more rows than a count implies (a fused gate, say), the rule is a bound
rather than an equality. The vocabulary arrays are checked for the kind and number of their
items, which the tokenizer build takes on trust.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any, Mapping

from tallow.plugin import ModelFileError

from .header import GGUFTensor

_BLOCK = re.compile(r"^blk\.(\d+)\.")
#: a context length beyond this is a corrupt value, not a model: rotary tables and the
#: scheduler's per-sequence buffers are sized from it before any tensor is read
MAX_CONTEXT_LENGTH = 1 << 24


class _Metadata:
    """Typed access to ``<arch>.*`` counts, with errors naming the key."""

    def __init__(self, path: pathlib.Path, metadata: Mapping[str, Any], arch: str) -> None:
        self.path, self.metadata, self.arch = path, metadata, arch

    def field(self, key: str) -> str:
        return f"metadata '{self.arch}.{key}'"

    def error(self, key: str, problem: str) -> ModelFileError:
        return ModelFileError(self.path, self.field(key), problem)

    def count(
        self, key: str, *, required: bool = False, least: int = 1, per_layer: int | None = None
    ) -> int | list[int] | None:
        """An integer count (or, with ``per_layer`` blocks, one per block) of at least ``least``."""
        value = self.metadata.get(f"{self.arch}.{key}")
        if value is None:
            if required:
                raise self.error(key, "missing; the model cannot be sized without it")
            return None
        values = value if isinstance(value, list) and per_layer is not None else [value]
        if isinstance(value, list) and per_layer is not None and len(value) != per_layer:
            raise self.error(key, f"lists {len(value)} per-layer values for {per_layer} blocks")
        for v in values:
            if not isinstance(v, int) or isinstance(v, bool):
                raise self.error(key, f"{v!r} is not an integer")
            if v < (0 if isinstance(value, list) else least):
                raise self.error(key, f"{v}; expected at least {least}")
        return value


def _at(value: int | list[int], layer: int) -> int:
    return value[layer] if isinstance(value, list) else value


def _rows(tensor: GGUFTensor) -> int:
    """Output rows of a matrix: its slowest GGUF dimension (the first of torch's shape)."""
    return tensor.shape[-1]


def check_metadata_against_tensors(
    path: pathlib.Path, metadata: Mapping[str, Any], tensors: Mapping[str, GGUFTensor]
) -> None:
    """Raise :class:`ModelFileError` naming the metadata key whose count the tensors deny.

    A file without tensors (a vocabulary-only GGUF) is not compared; the engine refuses to
    build a model from it.
    """
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        found = "missing" if arch is None else f"{arch!r}"
        raise ModelFileError(
            path,
            "metadata 'general.architecture'",
            f"{found}; expected the model family name (e.g. 'llama', 'qwen2')",
        )
    if not tensors:
        return
    meta = _Metadata(path, metadata, arch)
    blocks = _check_blocks(meta, tensors)
    hidden = meta.count("embedding_length", required=True)
    _check_embedding(meta, tensors, hidden)
    _check_heads(meta, tensors, blocks, hidden)
    ffn = meta.count("feed_forward_length", least=0, per_layer=blocks)
    if ffn is not None:
        for i in range(blocks):
            up = tensors.get(f"blk.{i}.ffn_up.weight")
            if up is not None and _at(ffn, i) > _rows(up):
                raise meta.error(
                    "feed_forward_length",
                    f"{_at(ffn, i)}, but tensor {up.name!r} has {_rows(up):,} rows",
                )
    experts = meta.count("expert_count", least=0)
    if experts:
        for i in range(blocks):
            up = tensors.get(f"blk.{i}.ffn_up_exps.weight")
            if up is not None and up.shape[-1] != experts:
                raise meta.error(
                    "expert_count",
                    f"{experts}, but tensor {up.name!r} holds {up.shape[-1]} experts",
                )
    context = meta.count("context_length")
    if context is not None and context > MAX_CONTEXT_LENGTH:
        raise meta.error(
            "context_length",
            f"{context} tokens is beyond any model's context "
            f"(at most {MAX_CONTEXT_LENGTH:,} is accepted)",
        )


#: vocabulary arrays: key -> (what each item must be, its description)
VOCABULARY_ARRAYS: dict[str, tuple[tuple[type, ...], str]] = {
    "tokenizer.ggml.tokens": ((str,), "strings"),
    "tokenizer.ggml.token_type": ((int,), "integers"),
    "tokenizer.ggml.scores": ((int, float), "numbers"),
    "tokenizer.ggml.merges": ((str,), "strings"),
}
#: vocabulary arrays with one entry per token
_PER_TOKEN = ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def check_vocabulary(path: pathlib.Path, metadata: Mapping[str, Any]) -> None:
    """Raise :class:`ModelFileError` when a vocabulary array has items of the wrong kind or a
    per-token array is not one entry per token: damage that would otherwise surface as a bare
    ``TypeError`` deep in the tokenizer build."""
    for key, (kinds, description) in VOCABULARY_ARRAYS.items():
        items = metadata.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            raise ModelFileError(
                path,
                f"metadata '{key}'",
                f"a {type(items).__name__}; expected a list of {description}",
            )
        wrong = next(
            (
                i
                for i, item in enumerate(items)
                if not isinstance(item, kinds) or isinstance(item, bool)
            ),
            None,
        )
        if wrong is not None:
            raise ModelFileError(
                path,
                f"metadata '{key}'",
                f"item {wrong} is {items[wrong]!r}; expected {description}",
            )
    tokens = metadata.get("tokenizer.ggml.tokens")
    for key in _PER_TOKEN:
        items = metadata.get(key)
        if tokens is not None and items is not None and len(items) != len(tokens):
            raise ModelFileError(
                path, f"metadata '{key}'", f"{len(items)} entries for {len(tokens)} tokens"
            )


def _check_blocks(meta: _Metadata, tensors: Mapping[str, GGUFTensor]) -> int:
    count = meta.count("block_count", required=True)
    assert isinstance(count, int)
    present = {int(m[1]) for name in tensors if (m := _BLOCK.match(name))}
    if not present:
        raise meta.error("block_count", f"{count}, but the file holds no block tensors (blk.<i>.*)")
    held = max(present) + 1
    if count != held:
        raise meta.error(
            "block_count",
            f"{count}, but the file holds tensors for {held} blocks (blk.0 ... blk.{held - 1})",
        )
    absent = sorted(set(range(held)) - present)
    if absent:
        raise meta.error(
            "block_count",
            f"{count}, but the file holds no tensors for block"
            f"{'s' if len(absent) > 1 else ''} "
            f"{', '.join(map(str, absent[:10]))}",
        )
    return count


def _check_embedding(meta: _Metadata, tensors: Mapping[str, GGUFTensor], hidden: Any) -> None:
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        return
    if len(embedding.shape) != 2:
        raise ModelFileError(
            meta.path,
            f"tensor {embedding.name!r}",
            f"shape {list(embedding.shape)}; expected [hidden, vocabulary]",
        )
    width, rows = embedding.shape
    if hidden != width:
        raise meta.error(
            "embedding_length", f"{hidden}, but tensor {embedding.name!r} has rows of {width:,}"
        )
    vocab_size = meta.count("vocab_size")
    tokens = meta.metadata.get("tokenizer.ggml.tokens")
    if vocab_size is not None:
        declared, field = vocab_size, meta.field("vocab_size")
    elif isinstance(tokens, list):
        declared, field = len(tokens), "metadata 'tokenizer.ggml.tokens'"
    else:
        return
    if declared != rows:
        raise ModelFileError(
            meta.path, field, f"{declared} tokens, but tensor {embedding.name!r} has {rows:,} rows"
        )
    output = tensors.get("output.weight")
    if output is not None and _rows(output) != rows:
        raise ModelFileError(
            meta.path,
            f"tensor {output.name!r}",
            f"{_rows(output):,} rows, but the vocabulary has {rows:,} tokens",
        )


def _sliding_layers(meta: _Metadata, blocks: int) -> set[int]:
    """The sliding-window layers a per-layer ``attention.sliding_window_pattern`` (one flag
    per block) names; none for a period or no pattern."""
    pattern = meta.metadata.get(f"{meta.arch}.attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) != blocks:
        return set()
    return {i for i, flag in enumerate(pattern) if flag}


def _lengths(meta: _Metadata, sliding: bool) -> tuple[Any, Any]:
    """(key, value) head sizes of a layer: ``attention.key_length_swa`` /
    ``value_length_swa`` on sliding layers where stated (Gemma 4), else the common ones."""
    key, value = meta.count("attention.key_length"), meta.count("attention.value_length")
    if sliding:
        key_swa = meta.count("attention.key_length_swa")
        value_swa = meta.count("attention.value_length_swa")
        key = key_swa if key_swa is not None else key
        value = value_swa if value_swa is not None else (key_swa if key_swa else value)
    return key, value


def _swa_hint(meta: _Metadata, layer: int) -> str:
    """Where a family has sliding layers of their own head size: which key would say so."""
    if meta.metadata.get(f"{meta.arch}.attention.key_length_swa") is None:
        return (
            f" (if block {layer} is a sliding-window layer with its own head size, the file "
            f"lacks '{meta.arch}.attention.key_length_swa')"
        )
    return (
        f" (block {layer} is taken as a full-attention layer: "
        f"'{meta.arch}.attention.sliding_window_pattern' does not flag it, or is not one flag "
        "per block)"
    )


def _check_heads(
    meta: _Metadata, tensors: Mapping[str, GGUFTensor], blocks: int, hidden: Any
) -> None:
    heads = meta.count("attention.head_count", required=True, per_layer=blocks)
    kv_heads = meta.count("attention.head_count_kv", least=0, per_layer=blocks)
    sliding = _sliding_layers(meta, blocks)
    for i in range(blocks):
        n_head = _at(heads, i)
        n_kv = n_head if kv_heads is None else _at(kv_heads, i)
        key_length, value_length = _lengths(meta, i in sliding)
        if key_length is not None:
            head_dim = key_length
        elif n_head and hidden % n_head == 0:
            head_dim = hidden // n_head
        elif n_head:
            raise meta.error(
                "attention.head_count",
                f"{n_head} heads do not divide "
                f"embedding_length {hidden} (and "
                "attention.key_length is not given)",
            )
        else:
            continue  # a layer without attention
        value_dim = value_length if value_length is not None else head_dim
        # At least as many rows as the heads need: some families store more (a gate beside Q).
        for suffix, key, count, dim in (
            ("attn_q", "attention.head_count", n_head, head_dim),
            ("attn_k", "attention.head_count_kv", n_kv, head_dim),
            ("attn_v", "attention.head_count_kv", n_kv, value_dim),
        ):
            tensor = tensors.get(f"blk.{i}.{suffix}.weight")
            if tensor is not None and count * dim > _rows(tensor):
                raise meta.error(
                    key,
                    f"{count} heads of {dim} need {count * dim:,} rows, "
                    f"but tensor {tensor.name!r} has {_rows(tensor):,}{_swa_hint(meta, i)}",
                )
