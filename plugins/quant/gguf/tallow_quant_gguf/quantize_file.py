"""``tallow quantize``: a model checkpoint → a quantized GGUF file.

The source is a :class:`tallow.plugin.Checkpoint` as a weight format read it:

- a GGUF file: its metadata (vocabulary included) is copied from the file, with the new
  ``general.file_type``; tensors that were quantized in the source (they arrive as
  :class:`tallow.layers.QuantizedWeight`) are dequantized to float32 and requantized — the new
  type's error comes on top of theirs (the log says which);
- a safetensors directory of a llama or qwen2 model: metadata, vocabulary and tensor names are
  written as llama.cpp's converter writes them (:mod:`tallow_quant_gguf.quantize_hf`).

Each tensor takes the type :class:`tallow_quant_gguf.quantize_mix.TensorTypes` gives it (in the
order the tensors are written, as llama.cpp counts them) and is quantized on ``device``, one tensor at a time; the writer spools tensor data to a temporary
file, so memory stays near one tensor whatever the model size.
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
from .quantize_mix import FILE_TYPES, LLAMA_FILE_TYPES, TensorTypes, check_file_type

log = logging.getLogger("tallow.quant.gguf")

#: metadata of a source GGUF that describes the file rather than the model
_FILE_KEYS = ("general.architecture", "general.file_type", "general.quantization_version",
              "general.alignment")
_PLAIN_TYPES = {"F32", "F16", "BF16", "F64"}


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
            raise ValueError(f"{path}: metadata key {key!r} is a nested array, which is not "
                             "copied")
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)


def _source(checkpoint: Any, writer_factory: Any) -> tuple[Any, Iterator[tuple[str, Any]],
                                                           dict[str, str], int]:
    """The writer with the model's metadata, the ``(gguf name, tensor)`` iterator, the source's
    tensor types and the tensor count."""
    files = checkpoint.extra.get("gguf_files")
    if files:
        arch = checkpoint.architecture.split(":", 1)[-1]
        writer = writer_factory(arch)
        _copy_gguf_metadata(writer, files[0])
        types = dict(checkpoint.extra.get("gguf_tensor_types", {}))
        return writer, iter(checkpoint.tensors()), types, len(types)
    from .quantize_hf import (add_model_metadata, add_tokenizer_metadata, gguf_architecture,
                              gguf_tensors)

    arch = gguf_architecture(checkpoint)
    writer = writer_factory(arch)
    add_model_metadata(writer, checkpoint, arch)
    add_tokenizer_metadata(writer, checkpoint)
    return writer, gguf_tensors(checkpoint, arch), {}, 0


def _layer_count(checkpoint: Any) -> int:
    value = checkpoint.config.get("num_hidden_layers")
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{checkpoint.source}: the config gives no layer count "
                         "(num_hidden_layers), which the mix rules need")
    return value


def _tied_output(checkpoint: Any, source_types: dict[str, str]) -> bool:
    if source_types:
        return "output.weight" not in source_types
    return bool(checkpoint.config.get("tie_word_embeddings", False))


def quantize_checkpoint(checkpoint: Any, out_path: str | os.PathLike[str], file_type: str, *,
                        device: str = "cpu", progress: bool = True) -> dict[str, Any]:
    """Write ``checkpoint`` to ``out_path`` as a GGUF file of ``file_type`` (a key of
    :data:`~tallow_quant_gguf.quantize_mix.FILE_TYPES`), quantizing on ``device``.

    Returns a summary: ``tensors`` (count per written type), ``requantized`` (source tensors
    that were block-quantized already), ``bytes`` (file size) and ``seconds``.
    """
    import torch
    from gguf import GGMLQuantizationType, GGUFWriter
    from tqdm.auto import tqdm

    file_type = check_file_type(file_type)
    started = time.perf_counter()
    out_path = os.fspath(out_path)
    writer, tensors, source_types, count = _source(
        checkpoint, lambda arch: GGUFWriter(out_path, arch, use_temp_file=True))
    requantized = sorted(name for name, t in source_types.items() if t not in _PLAIN_TYPES)
    if requantized:
        kinds = collections.Counter(source_types[n] for n in requantized)
        log.warning("%s: %d tensors are block-quantized in the source (%s); they are dequantized "
                    "and requantized, so their %s error adds to the source's", checkpoint.source,
                    len(requantized), ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())),
                    file_type)
    writer.add_file_type(LLAMA_FILE_TYPES[file_type])
    writer.add_quantization_version(2)
    plan = TensorTypes(file_type, n_layers=_layer_count(checkpoint),
                       tied_output=_tied_output(checkpoint, source_types))
    written: collections.Counter[str] = collections.Counter()
    with tqdm(total=count or None, desc=f"Quantizing to {file_type}", unit="tensor",
              disable=None if progress else True) as bar:
        for name, tensor in tensors:
            if isinstance(tensor, QuantizedWeight):
                tensor = tensor.dequantize()
            target = plan(name, tuple(tensor.shape))
            if target in QUANT_TYPES:
                rows = tensor.reshape(-1, tensor.shape[-1]).to(device)
                data = quantize(rows, target).cpu().numpy()
                data = data.reshape(*tensor.shape[:-1], data.shape[-1])  # e.g. [experts, ...]
                writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType[target.upper()])
            else:
                dtype = np.float16 if target == "f16" else np.float32
                writer.add_tensor(name, tensor.detach().to(torch.float32).cpu().numpy()
                                  .astype(dtype, copy=False))
            written[target] += 1
            bar.update(1)
            bar.set_postfix_str(f"{name} {target}", refresh=False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    summary = {"file_type": file_type, "tensors": dict(sorted(written.items())),
               "requantized": len(requantized), "bytes": os.path.getsize(out_path),
               "seconds": time.perf_counter() - started}
    log.info("wrote %s: %s, %s tensors, %.1f MB in %.1fs", out_path, file_type,
             ", ".join(f"{t} x{n}" for t, n in summary["tensors"].items()),
             summary["bytes"] / 1e6, summary["seconds"])
    return summary


class FileQuantization:
    """The ``tallow quantize`` side of the GGUF quant scheme, as a mixin:
    ``class GGUFScheme(FileQuantization, QuantScheme)`` offers every type of
    :data:`~tallow_quant_gguf.quantize_mix.FILE_TYPES` and writes it with
    :func:`quantize_checkpoint`."""

    file_types: tuple[str, ...] = FILE_TYPES

    @classmethod
    def quantize_file(cls, checkpoint: Any, out_path: str, file_type: str, *,
                      device: str = "cpu", progress: bool = True) -> dict[str, Any]:
        return quantize_checkpoint(checkpoint, out_path, file_type, device=device,
                                   progress=progress)
