"""GGUF files the way llama.cpp's converter writes them, for testing a model plugin's GGUF names
and ``config_from_gguf``: tensors named by the ``gguf`` package's own map for the architecture,
its architecture keys, a placeholder vocabulary. The ``gguf`` package is imported only when a
helper runs.

::

    tensors = gguf_tensors(hf.state_dict(), "olmo2", hf.config.num_hidden_layers)
    write_gguf(path, "olmo2", gguf_metadata(hf.config), tensors, hf.config.vocab_size)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

__all__ = ["gguf_tensors", "gguf_metadata", "write_gguf", "read_gguf"]


def gguf_tensors(
    state: Mapping[str, torch.Tensor],
    arch: str,
    num_layers: int,
    *,
    transform: Callable[[str, Any], Any] | None = None,
    skip: Iterable[str] = (),
) -> Iterator[tuple[str, Any]]:
    """``(gguf name, float32 numpy array)`` for each tensor of an HF ``state`` dict, named
    by the ``gguf`` package's map for GGUF architecture ``arch`` (what llama.cpp's converter
    uses; stacked experts ``experts.gate_up_proj`` are written as their gate and up halves,
    ``ffn_gate_exps`` and ``ffn_up_exps``). ``transform(hf name, array)`` may rewrite an array (a row permutation); names in
    ``skip`` are left out. A name the map does not know raises ``KeyError``."""
    import gguf
    import numpy as np

    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, num_layers)
    skipped = set(skip)
    for name, tensor in _unfused_experts(state):
        if name in skipped:
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise KeyError(f"the gguf name map of {arch!r} does not know {name!r}")
        array = tensor.detach().float().numpy()
        if transform is not None:
            array = transform(name, array)
        yield mapped, np.ascontiguousarray(array)


def _unfused_experts(state: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """The state's tensors, with transformers 5's stacked ``experts.gate_up_proj [E, 2I, H]``
    split into ``experts.gate_proj.weight`` and ``experts.up_proj.weight [E, I, H]`` and its
    ``experts.down_proj`` named ``experts.down_proj.weight`` (the stacked names llama.cpp's
    converter maps to ``ffn_{gate,up,down}_exps.weight``)."""
    for name, tensor in state.items():
        if name.endswith(".experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            gate, up = tensor.chunk(2, dim=1)
            yield base + "gate_proj.weight", gate
            yield base + "up_proj.weight", up
        elif name.endswith(".experts.down_proj"):
            yield name + ".weight", tensor
        else:
            yield name, tensor


def gguf_metadata(
    config: Any,  # Any: a transformers config of any architecture
    **extra: object,
) -> dict[str, Any]:
    """The architecture keys llama.cpp's converter writes for a transformers ``config`` (sizes,
    heads, norm epsilon, RoPE base and rotated features), without the ``<arch>.`` prefix, for
    :func:`write_gguf`; ``extra`` adds or replaces keys."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    rope = getattr(config, "rope_parameters", None) or {}
    partial = (
        rope.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", None) or 1.0
    )
    metadata: dict[str, Any] = {
        "block_count": config.num_hidden_layers,
        "context_length": config.max_position_embeddings,
        "embedding_length": config.hidden_size,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": heads,
        "attention.head_count_kv": config.num_key_value_heads or heads,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "rope.freq_base": float(
            rope.get("rope_theta") or getattr(config, "rope_theta", None) or 1e4
        ),
        "rope.dimension_count": int(head_dim * partial),
    }
    if head_dim != config.hidden_size // heads:
        metadata["attention.key_length"] = metadata["attention.value_length"] = head_dim
    return {**metadata, **extra}


def write_gguf(
    path: str | Path,
    arch: str,
    metadata: Mapping[str, Any],
    tensors: Iterable[tuple[Any, ...]],
    vocab_size: int,
    *,
    quantize: str | None = None,
) -> None:
    """Write a GGUF file of architecture ``arch``: ``metadata`` keys without the ``<arch>.``
    prefix (ints as uint32, floats as float32, strings, bools, lists of bools or of ints as
    such arrays, other lists as float32 arrays), a placeholder vocabulary of ``vocab_size`` tokens (padding id 0: transformers'
    GGUF loader wants one inside the vocabulary), and ``tensors``. ``quantize`` (a GGML type
    name such as ``"Q8_0"``) stores every matrix in that type with the ``gguf`` package's
    quantizer; vectors stay float32. A tensor given as ``(name, blocks, type name)`` is
    stored as those GGML blocks (uint8, one row of blocks per row) of that type."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        full = f"{arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        elif isinstance(value, str):
            writer.add_string(full, value)
        elif value and all(isinstance(v, bool) for v in value):
            writer.add_array(full, list(value))  # one flag per layer, as bools
        elif value and all(isinstance(v, int) for v in value):
            writer.add_array(full, list(value))  # per-layer counts, as integers
        else:
            writer.add_array(full, [float(v) for v in value])
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(vocab_size)])
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_token_types([1] * vocab_size)
    writer.add_pad_token_id(0)
    qtype = gguf.GGMLQuantizationType[quantize] if quantize else None
    for name, array, *raw in tensors:
        if raw:  # already GGML blocks: the shape follows from the bytes
            writer.add_tensor(name, array, raw_dtype=gguf.GGMLQuantizationType[raw[0]])
        elif qtype is not None and array.ndim == 2:
            blocks = gguf.quants.quantize(array, qtype)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def read_gguf(path: str | Path) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
    """``(metadata, [(name, float32 tensor)])`` of a GGUF file of float tensors, read with
    the ``gguf`` package's reader (independent of tallow's own)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [
        (t.name, torch.from_numpy(np.array(t.data, dtype=np.float32))) for t in reader.tensors
    ]
    return metadata, tensors
