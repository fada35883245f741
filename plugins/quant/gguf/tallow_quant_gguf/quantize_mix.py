"""Which GGML type each tensor gets when a model file is quantized to a file type.

A plain type (``q4_0`` … ``q6_k``) quantizes every quantizable tensor to that type — the same
choice in-situ quantization makes — except where the row length forces a fallback. The mixes
``q4_k_m`` and ``q5_k_m`` follow llama.cpp's ``llama_tensor_get_type`` for
``LLAMA_FTYPE_MOSTLY_Q4_K_M`` / ``Q5_K_M`` on dense models:

- ``output.weight``, and ``token_embd.weight`` when the output head is tied to it: Q6_K
  (Q8_0 when the row length is not a multiple of 256);
- the ``attn_v.weight`` and ``ffn_down.weight`` tensors whose count (in file order) satisfies
  ``use_more_bits`` (the first and last eighth, and every third one in between): Q6_K;
- everything else: Q4_K (``q4_k_m``) or Q5_K (``q5_k_m``).

Quantizable tensors are llama.cpp's: weights of two or more dimensions whose names end in
``weight``, except norms, MoE router weights and position/token-type embeddings. The rest
(norms, biases) are written as F32. The shape fallback is llama.cpp's too: a row length that
is not a multiple of the type's block (256 for k-quants) takes Q4_0 instead of Q2_K/Q3_K,
Q5_0 instead of Q4_K, Q5_1 instead of Q5_K, Q8_0 instead of Q6_K — and F16 when even 32 does
not divide it. (Rules llama.cpp keys on expert counts, the Falcon architecture or a 70B model
size are not applied: tallow's GGUF writer serves dense llama and qwen2 models.)
"""

from __future__ import annotations

import re
from typing import Sequence

from .quantize import QUANT_TYPES

#: the mixes, by their base type
MIXES: dict[str, str] = {"q4_k_m": "q4_k", "q5_k_m": "q5_k"}
#: every file type ``tallow quantize --type`` accepts
FILE_TYPES: tuple[str, ...] = tuple(QUANT_TYPES) + tuple(MIXES)
#: llama.cpp's general.file_type (LlamaFileType) of each file type; a plain k-quant is labelled
#: as the "small" mix of its type, the closest llama.cpp has to a uniform file
LLAMA_FILE_TYPES: dict[str, int] = {
    "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k": 11,
    "q4_k": 14, "q5_k": 16, "q6_k": 18, "q4_k_m": 15, "q5_k_m": 17,
}
#: llama.cpp's tensor_type_fallback
SHAPE_FALLBACK: dict[str, str] = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0",
                                  "q5_k": "q5_1", "q6_k": "q8_0"}

_NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight")
_LAYER = re.compile(r"^blk\.(\d+)\.")


def check_file_type(file_type: str) -> str:
    """``file_type`` normalised to lower case; ValueError listing the choices if unknown."""
    key = file_type.lower() if isinstance(file_type, str) else file_type
    if key not in FILE_TYPES:
        raise ValueError(f"--type {file_type!r} is not a file type this scheme writes; "
                         f"expected one of {', '.join(FILE_TYPES)}")
    return key


def is_quantizable(name: str, shape: Sequence[int]) -> bool:
    """llama.cpp's ``tensor_allows_quantization`` for the tensors of dense llama/qwen2 files."""
    return (len(shape) >= 2 and name.endswith("weight")
            and not any(part in name for part in _NOT_QUANTIZED)
            and name not in ("position_embd.weight", "token_types.weight"))


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v/ffn_down get more bits in the mixes."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def with_shape_fallback(qtype: str, row_length: int) -> str:
    """``qtype``, or what llama.cpp uses instead when ``row_length`` is not a multiple of its
    block size."""
    if row_length % QUANT_TYPES[qtype].block_elems == 0:
        return qtype
    fallback = SHAPE_FALLBACK.get(qtype)
    if fallback is not None and row_length % QUANT_TYPES[fallback].block_elems == 0:
        return fallback
    return "f16"


class TensorTypes:
    """The type of each tensor of one file, asked in the order the tensors are written.

    llama.cpp counts ``attn_v`` and ``ffn_down`` tensors as it meets them and applies
    ``use_more_bits`` to that count, not to the layer number; so does this. For a file in layer
    order the two agree; llama.cpp's converter writes safetensors tensors in name order
    (``blk.0, blk.1, blk.10, ...``), which is why its Q4_K_M of Qwen2.5-0.5B gives Q6_K to the
    ``ffn_down`` of layers 0, 1, 3, 6-10, 13, 16, 19, 21 — and re-mixing that file here gives it
    to the same ones.
    """

    def __init__(self, file_type: str, *, n_layers: int, tied_output: bool) -> None:
        self.file_type = check_file_type(file_type)
        self.n_layers = n_layers
        self.tied_output = tied_output
        self.seen = {"attn_v": 0, "ffn_down": 0}

    def __call__(self, name: str, shape: Sequence[int]) -> str:
        """The type ``name`` (a GGUF tensor name, ``shape`` in torch order) is written in:
        a key of :data:`QUANT_TYPES`, ``"f16"`` or ``"f32"``."""
        if not is_quantizable(name, shape):
            return "f32"
        row_length = int(shape[-1])
        base = MIXES.get(self.file_type, self.file_type)
        chosen = base
        counted = ("attn_v" if any(p in name for p in ("attn_v.weight", "attn_qkv.weight",
                                                       "attn_kv_b.weight"))
                   else "ffn_down" if "ffn_down" in name else None)
        if self.file_type in MIXES:
            if name == "output.weight" or (self.tied_output and name == "token_embd.weight"):
                chosen = "q6_k" if row_length % QUANT_TYPES[base].block_elems == 0 else "q8_0"
            elif counted is not None and use_more_bits(self.seen[counted], self.n_layers):
                chosen = "q6_k"
        if counted is not None:
            self.seen[counted] += 1
        return with_shape_fallback(chosen, row_length)


def tensor_type(name: str, shape: Sequence[int], file_type: str, *, n_layers: int,
                tied_output: bool) -> str:
    """The type of one tensor of a file in layer order (the ``attn_v``/``ffn_down`` count taken
    from the layer number in the name): :class:`TensorTypes` for a single tensor."""
    plan = TensorTypes(file_type, n_layers=n_layers, tied_output=tied_output)
    match = _LAYER.match(name)
    if match:
        for key in plan.seen:
            plan.seen[key] = int(match.group(1))
    return plan(name, shape)
