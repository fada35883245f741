"""Which GGML type each tensor gets when a model is written as a file type: llama.cpp's rules.

The rules are those of ``llama_tensor_get_type`` in llama.cpp's ``src/llama-quant.cpp``, as
vendored in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e57098bba, October 2026), for the
file types whose block quantizers tallow has, without an importance matrix, on dense models.
They are written as data: :data:`FILE_TYPES` gives each file type its default block type and,
per tensor category, an ordered list of ``(condition, type)`` rules — the first rule whose
condition holds picks the type, no rule keeps the default. Then, as in llama.cpp:

- ``output.weight``, and ``token_embd.weight`` when the output head is tied to it, take Q6_K
  (:data:`OUTPUT_RULES`): Q8_0 when their rows are not whole blocks of the default type, or
  when the default is Q8_0;
- the ``attn_v`` of a 70B-class model (80 layers; for ``llama`` also grouped-query attention)
  is raised from Q3_K/Q4_K to Q5_K (:data:`LARGE_MODEL_ATTN_V`);
- a row length that is not a multiple of the chosen type's block takes llama.cpp's fallback
  (:data:`SHAPE_FALLBACK`): Q4_0 for Q2_K/Q3_K, Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K, and
  F16 when even that type's block does not divide the row.

The conditions use the index llama.cpp counts for ``attn_v`` and ``ffn_down`` tensors: it visits
the tensors ordered by layer number (then name), so in a dense model — one ``attn_v`` and one
``ffn_down`` per layer — the index of a tensor is its layer number and the count is the number
of layers. ``use_more_bits`` marks the first and last eighth of the layers and every third one
in between.

Quantizable tensors are llama.cpp's: two or more dimensions, a name ending in ``weight``,
except norms, MoE router weights, position/token-type embeddings and a few small tensors of
other families (:data:`NOT_QUANTIZED`); the rest keep their type.

``--type q3_k``, ``q4_k`` and ``q5_k`` are what ``llama-quantize`` makes of ``Q3_K``, ``Q4_K``
and ``Q5_K``: aliases of the ``_m`` mixes (:data:`ALIASES`). ``q2_k`` and ``q6_k`` are
llama.cpp's own file types of those names (Q2_K is itself a mix). Not applied: the rules
llama.cpp keys on expert counts (MoE), the Falcon architecture and an importance matrix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from .quantize import QUANT_TYPES

# --------------------------------------------------------------------------------------------
# Tensor categories (llama.cpp's tensor_get_category): the first match wins
# --------------------------------------------------------------------------------------------
#: ``(how the name matches, the text, category)``; ``attn_qkv`` and ``attn_kv_b`` follow the
#: ``attn_v`` rules, as llama.cpp's ``category_is_attn_v`` has them
CATEGORIES: tuple[tuple[str, str, str], ...] = (
    ("equals", "output.weight", "output"),
    ("equals", "token_embd.weight", "token_embd"),
    ("equals", "per_layer_token_embd.weight", "token_embd"),
    ("contains", "attn_qkv.weight", "attn_v"),
    ("contains", "attn_kv_b.weight", "attn_v"),
    ("contains", "attn_v.weight", "attn_v"),
    ("contains", "attn_k.weight", "attn_k"),
    ("contains", "attn_q.weight", "attn_q"),
    ("contains", "attn_output.weight", "attn_output"),
    ("contains", "ffn_up", "ffn_up"),
    ("contains", "ffn_gate", "ffn_gate"),
    ("contains", "ffn_down", "ffn_down"),
)

#: name parts of weights llama.cpp never quantizes (tensor_allows_quantization)
NOT_QUANTIZED: tuple[str, ...] = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "attn_rel_b.weight",
    "time_mix_",
    ".position_embd",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
)
NOT_QUANTIZED_NAMES: tuple[str, ...] = ("position_embd.weight", "token_types.weight")


# --------------------------------------------------------------------------------------------
# Conditions: (index, count, model) -> bool
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelTraits:
    """What llama.cpp's rules read of the model besides the tensor itself."""

    #: transformer layers (llama.cpp's n_layer), the count of ``attn_v``/``ffn_down`` tensors
    n_layers: int
    #: the output head is the token embedding (no ``output.weight``)
    tied_output: bool
    #: attention heads per key/value head (``n_head / n_head_kv``)
    n_gqa: int = 1
    #: llama.cpp's ``LLM_TYPE_70B`` (80 layers; grouped-query attention for ``llama``)
    is_70b: bool = False


def use_more_bits(index: int, count: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v/ffn_down get more bits in the mixes."""
    eighth = count // 8
    return index < eighth or index >= 7 * count // 8 or (index - eighth) % 3 == 2


Condition = Callable[[int, int, ModelTraits], bool]
CONDITIONS: dict[str, Condition] = {
    "always": lambda i, n, m: True,
    "use_more_bits": lambda i, n, m: use_more_bits(i, n),
    "first 2": lambda i, n, m: i < 2,
    "first 4": lambda i, n, m: i < 4,
    "first eighth": lambda i, n, m: i < n // 8,
    "first sixteenth": lambda i, n, m: i < n // 16,
    "gqa >= 4": lambda i, n, m: m.n_gqa >= 4,
}


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------
Rules = Mapping[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class FileType:
    """One llama.cpp file type (``llama_ftype``): its default block type and its rules."""

    name: str
    #: ``general.file_type`` (LLAMA_FTYPE_MOSTLY_*)
    llama_ftype: int
    #: llama_ftype_get_default_type
    default: str
    #: category -> ordered ``(condition, type)``; the first whose condition holds applies
    rules: Rules


_MORE_BITS_Q6 = (("use_more_bits", "q6_k"),)

FILE_TYPES_TABLE: tuple[FileType, ...] = (
    FileType("q4_0", 2, "q4_0", {}),
    FileType("q4_1", 3, "q4_1", {}),
    FileType("q5_0", 8, "q5_0", {}),
    FileType("q5_1", 9, "q5_1", {}),
    FileType("q8_0", 7, "q8_0", {}),
    FileType(
        "q2_k",
        10,
        "q2_k",
        {
            "attn_v": (("gqa >= 4", "q4_k"), ("always", "q3_k")),
            "ffn_down": (("always", "q3_k"),),
            "attn_output": (("always", "q3_k"),),
        },
    ),
    FileType("q3_k_s", 11, "q3_k", {}),
    FileType(
        "q3_k_m",
        12,
        "q3_k",
        {
            "attn_v": (("first 2", "q5_k"), ("always", "q4_k")),
            "ffn_down": (("first sixteenth", "q5_k"), ("always", "q4_k")),
            "attn_output": (("always", "q4_k"),),
        },
    ),
    FileType(
        "q3_k_l",
        13,
        "q3_k",
        {
            "attn_v": (("always", "q5_k"),),
            "ffn_down": (("always", "q5_k"),),
            "attn_output": (("always", "q5_k"),),
        },
    ),
    FileType(
        "q4_k_s",
        14,
        "q4_k",
        {
            "attn_v": (("first 4", "q5_k"),),
            "ffn_down": (("first eighth", "q5_k"),),
        },
    ),
    FileType("q4_k_m", 15, "q4_k", {"attn_v": _MORE_BITS_Q6, "ffn_down": _MORE_BITS_Q6}),
    FileType("q5_k_s", 16, "q5_k", {}),
    FileType("q5_k_m", 17, "q5_k", {"attn_v": _MORE_BITS_Q6, "ffn_down": _MORE_BITS_Q6}),
    FileType("q6_k", 18, "q6_k", {}),
)
FILE_TYPE_BY_NAME: dict[str, FileType] = {t.name: t for t in FILE_TYPES_TABLE}
#: llama-quantize's aliases (its QUANT_OPTIONS): a bare k-quant name is the "_m" mix
ALIASES: dict[str, str] = {"q3_k": "q3_k_m", "q4_k": "q4_k_m", "q5_k": "q5_k_m"}
#: every name ``tallow quantize --type`` accepts
FILE_TYPES: tuple[str, ...] = tuple(FILE_TYPE_BY_NAME) + tuple(ALIASES)
#: llama.cpp's general.file_type of each accepted name
LLAMA_FILE_TYPES: dict[str, int] = {
    name: FILE_TYPE_BY_NAME[ALIASES.get(name, name)].llama_ftype for name in FILE_TYPES
}

#: the output head (and a tied token embedding), every file type here
OUTPUT_RULES: tuple[tuple[str, str], ...] = (
    ("rows not whole default blocks", "q8_0"),
    ("default is not q8_0", "q6_k"),
)
#: attn_v of a 70B-class model: these types are raised to Q5_K
LARGE_MODEL_ATTN_V: dict[str, str] = {"q3_k": "q5_k", "q4_k": "q5_k"}
#: llama.cpp's tensor_type_fallback
SHAPE_FALLBACK: dict[str, str] = {
    "q2_k": "q4_0",
    "q3_k": "q4_0",
    "q4_k": "q5_0",
    "q5_k": "q5_1",
    "q6_k": "q8_0",
}
#: the categories whose rules read a per-tensor index (the layer, in a dense model)
INDEXED = ("attn_v", "ffn_down")

_LAYER = re.compile(r"^blk\.(\d+)\.")


def check_file_type(file_type: str) -> str:
    """``file_type`` normalised to lower case; ValueError listing the choices if unknown."""
    key = file_type.lower() if isinstance(file_type, str) else file_type
    if key not in FILE_TYPES:
        raise ValueError(
            f"--type {file_type!r} is not a file type this scheme writes; "
            f"expected one of {', '.join(FILE_TYPES)}"
        )
    return key


def file_type_entry(file_type: str) -> FileType:
    """The table entry of ``file_type`` (an alias resolved)."""
    key = check_file_type(file_type)
    return FILE_TYPE_BY_NAME[ALIASES.get(key, key)]


def category(name: str) -> str:
    """llama.cpp's tensor category of the GGUF tensor ``name`` (``"other"`` if none)."""
    for how, text, cat in CATEGORIES:
        if (name == text) if how == "equals" else (text in name):
            return cat
    return "other"


def is_quantizable(name: str, shape: Sequence[int]) -> bool:
    """llama.cpp's ``tensor_allows_quantization``."""
    return (
        len(shape) >= 2
        and name.endswith("weight")
        and not any(part in name for part in NOT_QUANTIZED)
        and name not in NOT_QUANTIZED_NAMES
    )


def layer_of(name: str) -> int | None:
    """The layer number of a ``blk.N.*`` tensor name."""
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


def with_shape_fallback(qtype: str, row_length: int) -> str:
    """``qtype``, or what llama.cpp uses instead when ``row_length`` is not a multiple of its
    block size."""
    if row_length % QUANT_TYPES[qtype].block_elems == 0:
        return qtype
    fallback = SHAPE_FALLBACK.get(qtype, qtype)
    if row_length % QUANT_TYPES[fallback].block_elems == 0:
        return fallback
    return "f16"


def _first_rule(
    rules: tuple[tuple[str, str], ...], index: int, count: int, model: ModelTraits
) -> str | None:
    for condition, qtype in rules:
        if CONDITIONS[condition](index, count, model):
            return qtype
    return None


def _output_type(entry: FileType, row_length: int) -> str:
    default_block = QUANT_TYPES[entry.default].block_elems
    holds = {
        "rows not whole default blocks": row_length % default_block != 0,
        "default is not q8_0": entry.default != "q8_0",
    }
    return next((qtype for condition, qtype in OUTPUT_RULES if holds[condition]), entry.default)


def tensor_type(
    name: str, shape: Sequence[int], file_type: str, model: ModelTraits, *, index: int | None = None
) -> str | None:
    """The type llama.cpp's rules give tensor ``name`` (``shape`` in torch order, rows last)
    in a file of ``file_type``: a key of :data:`QUANT_TYPES` or ``"f16"``; None for a tensor
    that is not quantized (it keeps its type).

    ``index`` is llama.cpp's running count of the tensor's category (``attn_v``,
    ``ffn_down``); by default the layer number in the name, which it is in a dense model.
    """
    if not is_quantizable(name, shape):
        return None
    entry = file_type_entry(file_type)
    row_length = int(shape[-1])
    cat = category(name)
    if cat == "output" or (cat == "token_embd" and model.tied_output):
        return with_shape_fallback(_output_type(entry, row_length), row_length)
    chosen = entry.default
    if cat in entry.rules:
        if index is None:
            index = layer_of(name)
        if index is None and cat in INDEXED:
            raise ValueError(
                f"tensor {name!r}: a {cat} tensor outside a blk.N layer; the "
                f"{entry.name} rules need its layer"
            )
        chosen = _first_rule(entry.rules[cat], index or 0, model.n_layers, model) or chosen
    if cat == "attn_v" and model.is_70b:
        chosen = LARGE_MODEL_ATTN_V.get(chosen, chosen)
    return with_shape_fallback(chosen, row_length)


def model_traits(
    config: Mapping[str, object], architecture: str, *, tied_output: bool
) -> ModelTraits:
    """:class:`ModelTraits` from a Hugging Face style config (``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``) of a ``llama`` or ``qwen2``-style model."""
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise ValueError(
            "the config gives no layer count (num_hidden_layers), which the mix rules need"
        )
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    gqa = (
        heads // kv_heads
        if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads > 0
        else 1
    )
    arch = architecture.split(":", 1)[-1].lower()
    is_70b = layers == 80 and (
        heads != kv_heads
        if arch in ("llama", "llamaforcausallm")
        else arch in ("qwen2", "qwen2forcausallm")
    )
    return ModelTraits(n_layers=layers, tied_output=tied_output, n_gqa=gqa, is_70b=is_70b)
