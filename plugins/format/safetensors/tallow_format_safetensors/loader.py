"""Reading a Hugging Face model directory into a :class:`tallow.plugin.Checkpoint`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tallow.plugin import Checkpoint, ModelFileError

from .files import iter_tensors, read_headers, weight_files
from .sentence_transformers import read_embedding_spec
from .tokenizer_files import read_json, read_tokenizer, read_tokenizer_config


def is_model_directory(path: str | os.PathLike[str]) -> bool:
    """A directory with ``config.json`` and safetensors weights (or their index)."""
    root = Path(path)
    if not root.is_dir() or not (root / "config.json").is_file():
        return False
    return (root / "model.safetensors.index.json").is_file() or any(root.glob("*.safetensors"))


def architecture_of(config: dict[str, Any], where: Path) -> str:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ModelFileError(
            where / "config.json",
            "'architectures'",
            "must be a non-empty list of model class names (e.g. "
            f'["LlamaForCausalLM"]), got {archs!r}',
        )
    return archs[0]


def load_directory(
    path: str | os.PathLike[str], *, source: str | None = None, progress: bool | None = None
) -> Checkpoint:
    """The :class:`Checkpoint` of a model directory.

    Reads ``config.json`` (required), the weight files (``model.safetensors.index.json`` or every
    ``*.safetensors``; their headers are checked now, the tensors read lazily, as
    ``Checkpoint.tensors()`` is iterated),
    ``tokenizer.json``, ``tokenizer_config.json`` (with ``special_tokens_map.json`` and
    ``chat_template.jinja``), ``generation_config.json`` and the sentence-transformers files
    (``modules.json`` and the modules' settings). ``source`` is what the user named
    (a hub id, say); it defaults to the path.
    """
    root = Path(path)
    if not root.is_dir():
        raise ModelFileError(root, None, "is not a directory")
    if not (root / "config.json").is_file():
        raise ModelFileError(root, None, "has no config.json")
    config = read_json(root / "config.json")
    architecture = architecture_of(config, root)
    files = weight_files(root)
    tensors = read_headers(files)  # checked before anything is built from the config
    quant = config.get("quantization_config")
    quantization = quant.get("quant_method") if isinstance(quant, dict) else None
    return Checkpoint(
        source=source or str(root),
        config=config,
        architecture=architecture,
        tensors=lambda: iter_tensors(files, desc=f"Loading {root.name}", progress=progress),
        naming="hf",
        tokenizer=read_tokenizer(root),
        tokenizer_config=read_tokenizer_config(root),
        generation_config=read_json(root / "generation_config.json"),
        quantization=quantization,
        extra={
            "path": str(root),
            "files": [str(f) for f in files],
            "dtype": config.get("torch_dtype") or config.get("dtype"),
        },
        tensor_shapes={name: entry.shape for name, (_, entry) in tensors.items()},
        config_path=str(root / "config.json"),
        embedding=read_embedding_spec(root),
    )
