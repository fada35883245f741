"""The GGUF weight format: a ``.gguf`` file (or its split shards) → a :class:`Checkpoint`."""

from __future__ import annotations

import logging
import pathlib
import time
from typing import Any, ClassVar, Iterator

from tallow.plugin import Checkpoint, ModelFileError, WeightFormat

from .config import config_from_metadata, torch_dtype_of
from .dequant import dequantize, dequantize_blocks, is_block_quantized, logical_shape, type_name
from .reader import GGUFModelFile, open_gguf
from .tokenizer import TokenizerBuildError, build_tokenizer

log = logging.getLogger("tallow.gguf")

#: Array-valued metadata that is the vocabulary itself: kept out of ``extra["gguf_metadata"]``.
VOCAB_ARRAY_KEYS = frozenset(
    {
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.precompiled_charsmap",
    }
)
#: Any other list longer than this is left out of the plain metadata too.
MAX_PLAIN_LIST = 65536


def plain_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata without the vocabulary arrays (and any other very long list)."""
    return {
        key: value
        for key, value in metadata.items()
        if key not in VOCAB_ARRAY_KEYS
        and not (isinstance(value, list) and len(value) > MAX_PLAIN_LIST)
    }


class GGUFFormat(WeightFormat):
    """GGUF model files (llama.cpp's format), single or split with gguf-split.

    ``load`` returns a checkpoint whose ``tensors()`` yields ``(gguf tensor name, tensor)`` one
    tensor at a time, matrices in torch order ``[out, in]``: float types as float32 tensors,
    block-quantized types (Q4_K, Q8_0, ...) as :class:`tallow.layers.QuantizedWeight` holding
    the file's blocks (one row of blocks per matrix row) with the gguf package's dequantizer.
    The checkpoint's ``quantization`` is then ``"gguf"``: a quant scheme of that name keeps the
    blocks; without one the engine dequantizes them at load. The tensors are the file's as
    stored: family-specific transformations llama.cpp applied at conversion (the Q/K row
    permutation of ``llama`` files, norm offsets of some families) are the model class's to
    undo.
    """

    name: ClassVar[str] = "gguf"

    @classmethod
    def claims(cls, source: str) -> bool:
        """True for a path to an existing ``.gguf`` file."""
        if not isinstance(source, str) or not source.lower().endswith(".gguf"):
            return False
        return pathlib.Path(source).expanduser().is_file()

    def load(self, source: str, *, revision: str | None = None) -> Checkpoint:
        """Read the metadata, build config and tokenizer; tensors are read later, lazily.

        ``revision`` has no meaning for a local file and is ignored.
        """
        path = pathlib.Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"model.source {source!r}: no such GGUF file")
        started = time.perf_counter()
        checkpoint = self.checkpoint(open_gguf(path), source=str(path))
        log.info(
            "read GGUF %s (%s, %d tensors, %d file%s) in %.1fs",
            path.name,
            checkpoint.architecture,
            len(checkpoint.extra["gguf_tensor_types"]),
            len(checkpoint.extra["gguf_files"]),
            "s" if len(checkpoint.extra["gguf_files"]) > 1 else "",
            time.perf_counter() - started,
        )
        return checkpoint

    def checkpoint(self, model: GGUFModelFile, source: str | None = None) -> Checkpoint:
        """The checkpoint of an opened GGUF model (:func:`tallow_format_gguf.reader.open_gguf`);
        ``source`` (default: the first file) is recorded as the checkpoint's source."""
        path = model.paths[0]
        metadata = model.metadata
        arch = model.architecture
        tokenizer: Any = None
        tokenizer_config: dict[str, Any] = {}
        generation_config: dict[str, Any] = {}
        extra: dict[str, Any] = {
            "gguf_metadata": plain_metadata(metadata),
            "gguf_files": [str(p) for p in model.paths],
            "gguf_tensor_types": {name: type_name(t) for name, t in model.tensors.items()},
        }
        try:
            tokenizer, tokenizer_config, generation_config = build_tokenizer(metadata)
        except TokenizerBuildError as exc:
            # A model may still be served with a tokenizer named in the config.
            log.warning("%s: no tokenizer built from the GGUF vocabulary: %s", path, exc)
            extra["tokenizer_error"] = str(exc)
        types = [(type_name(t), len(t.shape)) for t in model.tensors.values()]
        vocab = tokenizer.get_vocab_size(with_added_tokens=True) if tokenizer else None
        try:
            config = config_from_metadata(
                metadata, model.tensors.keys(), vocab_size=vocab, torch_dtype=torch_dtype_of(types)
            )
        except ValueError as exc:  # names the key, not the file
            raise ModelFileError(path, None, str(exc)) from None
        return Checkpoint(
            source=source or str(path),
            config=config,
            architecture="gguf:" + arch,
            tensors=lambda: _iter_tensors(model),
            naming="gguf",
            tokenizer=tokenizer,
            tokenizer_config=tokenizer_config,
            generation_config=generation_config,
            quantization="gguf"
            if any(is_block_quantized(t) for t in model.tensors.values())
            else None,
            extra=extra,
            tensor_shapes={name: logical_shape(t) for name, t in model.tensors.items()},
            config_path=str(path),
        )


def _iter_tensors(model: GGUFModelFile) -> Iterator[tuple[str, Any]]:
    """One tensor at a time, with a progress bar (shown on a terminal only)."""
    from tqdm.auto import tqdm

    with tqdm(
        total=len(model.tensors),
        desc="Reading GGUF tensors",
        unit="tensor",
        disable=None,
        leave=False,
    ) as bar:
        for name, tensor in model.tensors.items():
            yield name, read_tensor(tensor)
            bar.update(1)


def read_tensor(tensor: Any) -> Any:
    """A reader tensor as a float32 torch tensor, or as a
    :class:`tallow.layers.QuantizedWeight` when it is block-quantized."""
    import numpy as np
    import torch

    if not is_block_quantized(tensor):
        return torch.from_numpy(dequantize(tensor))
    from tallow.layers import QuantizedWeight

    shape = logical_shape(tensor)
    # a copy: the memory map is read-only, and the copy is freed once the weight is loaded
    data = torch.from_numpy(np.array(tensor.data, dtype=np.uint8).reshape(*shape[:-1], -1))
    return QuantizedWeight("gguf", type_name(tensor), shape, data, dequantize_blocks)
