"""``tallow quantize``: a model checkpoint → a quantized GGUF file.

The source is a :class:`tallow.plugin.Checkpoint` as a weight format read it:

- a GGUF file: its metadata (vocabulary included) is copied from the file, with the new
  ``general.file_type``; tensors that were quantized in the source (they arrive as
  :class:`tallow.layers.QuantizedWeight`) are dequantized to float32 and requantized — the new
  type's error comes on top of theirs (the log says which);
- a safetensors directory of a llama or qwen2 model: metadata, vocabulary and tensor names are
  written as llama.cpp's converter writes them (:mod:`tallow_quant_gguf.quantize_hf`).

Each tensor takes the type llama.cpp's ``llama-quantize`` gives it for the file type
(:func:`tallow_quant_gguf.quantize_mix.tensor_type`) and is quantized on ``device``, one tensor
at a time; the writer spools tensor data to a temporary file, so memory stays near one tensor
whatever the model size. As in llama.cpp, a tensor that is not quantized keeps its type (F32
for the 1-D tensors of a safetensors source), and a source tensor already of its target block
type is copied as it is.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Any, Iterator

import numpy as np

from tallow.layers import QuantizedWeight

from .quantize import QUANT_TYPES, quantize
from .quantize_mix import (
    FILE_TYPES,
    LLAMA_FILE_TYPES,
    ModelTraits,
    check_file_type,
    model_traits,
    tensor_type,
)

log = logging.getLogger("tallow.quant.gguf")

#: metadata of a source GGUF that describes the file rather than the model
_FILE_KEYS = (
    "general.architecture",
    "general.file_type",
    "general.quantization_version",
    "general.alignment",
)


def _copy_gguf_metadata(writer: Any, path: str) -> None:
    """Every key/value of the GGUF file at ``path`` except those describing the file itself."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    for key, field in reader.fields.items():
        if key.startswith(("GGUF.", "split.")) or key in _FILE_KEYS:
            continue
        vtype = GGUFValueType(field.types[0])
        sub_type = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
        if vtype == GGUFValueType.ARRAY and len(field.types) > 2:
            raise ValueError(f"{path}: metadata key {key!r} is a nested array, which is not copied")
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)


def _source(
    checkpoint: Any, writer_factory: Any
) -> tuple[Any, Iterator[tuple[str, Any]], dict[str, str], int]:
    """The writer with the model's metadata, the ``(gguf name, tensor)`` iterator, the source's
    tensor types and the tensor count."""
    files = checkpoint.extra.get("gguf_files")
    if files:
        arch = checkpoint.architecture.split(":", 1)[-1]
        writer = writer_factory(arch)
        _copy_gguf_metadata(writer, files[0])
        types = dict(checkpoint.extra.get("gguf_tensor_types", {}))
        return writer, iter(checkpoint.tensors()), types, len(types)
    from .quantize_hf import (
        add_model_metadata,
        add_tokenizer_metadata,
        gguf_architecture,
        gguf_tensors,
    )

    arch = gguf_architecture(checkpoint)
    writer = writer_factory(arch)
    add_model_metadata(writer, checkpoint, arch)
    add_tokenizer_metadata(writer, checkpoint)
    return writer, gguf_tensors(checkpoint, arch), {}, 0


def _traits(checkpoint: Any, source_types: dict[str, str]) -> ModelTraits:
    if source_types:  # llama.cpp: tied unless the file has an output.weight
        tied = "output.weight" not in source_types
    else:
        tied = bool(checkpoint.config.get("tie_word_embeddings", False))
    try:
        return model_traits(checkpoint.config, checkpoint.architecture, tied_output=tied)
    except ValueError as exc:
        raise ValueError(f"{checkpoint.source}: {exc}") from None


def _kept_type(source_type: str | None) -> str:
    """The type a tensor llama.cpp does not quantize is written in: its source type when that
    is a float type, else F32."""
    kind = (source_type or "F32").lower()
    return kind if kind in ("f32", "f16", "bf16") else "f32"


def _add_float(writer: Any, name: str, tensor: Any, target: str) -> None:
    """``tensor`` written as F32, F16 or BF16 (BF16 by truncating the float32 bits of values
    that came from BF16, which is exact)."""
    import torch
    from gguf import GGMLQuantizationType

    if isinstance(tensor, QuantizedWeight):
        tensor = tensor.dequantize()
    values = tensor.detach().to(torch.float32).cpu().contiguous()
    if target == "bf16":
        raw = (values.view(torch.int32) >> 16).to(torch.int16).numpy().view(np.uint8)
        writer.add_tensor(
            name, raw.reshape(*values.shape[:-1], -1), raw_dtype=GGMLQuantizationType.BF16
        )
        return
    writer.add_tensor(
        name, values.numpy().astype(np.float16 if target == "f16" else np.float32, copy=False)
    )


def quantize_checkpoint(
    checkpoint: Any,
    out_path: str | os.PathLike[str],
    file_type: str,
    *,
    device: str = "cpu",
    progress: bool = True,
) -> dict[str, Any]:
    """Write ``checkpoint`` to ``out_path`` as a GGUF file of ``file_type`` (a key of
    :data:`~tallow_quant_gguf.quantize_mix.FILE_TYPES`), quantizing on ``device``.

    Returns a summary: ``tensors`` (count per written type), ``requantized`` (source tensors
    that were block-quantized already), ``bytes`` (file size) and ``seconds``.
    """
    from gguf import GGMLQuantizationType, GGUFWriter
    from tqdm.auto import tqdm

    file_type = check_file_type(file_type)
    started = time.perf_counter()
    out_path = os.fspath(out_path)
    writer, tensors, source_types, count = _source(
        checkpoint, lambda arch: GGUFWriter(out_path, arch, use_temp_file=True)
    )
    writer.add_file_type(LLAMA_FILE_TYPES[file_type])
    writer.add_quantization_version(2)
    traits = _traits(checkpoint, source_types)
    written: collections.Counter[str] = collections.Counter()
    requantized: collections.Counter[str] = collections.Counter()
    with tqdm(
        total=count or None,
        desc=f"Quantizing to {file_type}",
        unit="tensor",
        disable=None if progress else True,
    ) as bar:
        for name, tensor in tensors:
            shape = tuple(tensor.shape)
            target = tensor_type(name, shape, file_type, traits) or _kept_type(
                source_types.get(name)
            )
            if isinstance(tensor, QuantizedWeight) and tensor.qtype.lower() == target:
                data = tensor.data.cpu().numpy()  # llama.cpp copies a tensor of its target type
                writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType[target.upper()])
            elif target in QUANT_TYPES:
                values = tensor
                if isinstance(tensor, QuantizedWeight):
                    requantized[tensor.qtype] += 1
                    values = tensor.dequantize()
                rows = values.reshape(-1, shape[-1]).to(device)
                data = quantize(rows, target).cpu().numpy()
                data = data.reshape(*shape[:-1], data.shape[-1])  # e.g. [experts, ...]
                writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType[target.upper()])
            else:
                _add_float(writer, name, tensor, target)
            written[target] += 1
            bar.update(1)
            bar.set_postfix_str(f"{name} {target}", refresh=False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if requantized:
        log.warning(
            "%s: %d tensors were block-quantized in the source (%s); they were "
            "dequantized and requantized, so their %s error adds to the source's",
            checkpoint.source,
            sum(requantized.values()),
            ", ".join(f"{k} x{v}" for k, v in sorted(requantized.items())),
            file_type,
        )
    summary = {
        "file_type": file_type,
        "tensors": dict(sorted(written.items())),
        "requantized": sum(requantized.values()),
        "bytes": os.path.getsize(out_path),
        "seconds": time.perf_counter() - started,
    }
    log.info(
        "wrote %s: %s, %s tensors, %.1f MB in %.1fs",
        out_path,
        file_type,
        ", ".join(f"{t} x{n}" for t, n in summary["tensors"].items()),
        summary["bytes"] / 1e6,
        summary["seconds"],
    )
    return summary


class FileQuantization:
    """The ``tallow quantize`` side of the GGUF quant scheme, as a mixin:
    ``class GGUFScheme(FileQuantization, QuantScheme)`` offers every type of
    :data:`~tallow_quant_gguf.quantize_mix.FILE_TYPES` and writes it with
    :func:`quantize_checkpoint`."""

    file_types: tuple[str, ...] = FILE_TYPES

    @classmethod
    def quantize_file(
        cls,
        checkpoint: Any,
        out_path: str,
        file_type: str,
        *,
        device: str = "cpu",
        progress: bool = True,
    ) -> dict[str, Any]:
        return quantize_checkpoint(
            checkpoint, out_path, file_type, device=device, progress=progress
        )
