"""Which ``*.safetensors`` files make up a checkpoint, and reading their tensors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # pragma: no cover
    import torch

INDEX_NAME = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A model directory that cannot be read as a safetensors checkpoint."""


def weight_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The ``*.safetensors`` files of the checkpoint in ``directory``, in load order.

    With ``model.safetensors.index.json`` the files are those its ``weight_map`` names (other
    ``*.safetensors`` beside them, such as a ``consolidated.safetensors`` copy, are not part of
    the checkpoint); every one must exist. Without an index, every ``*.safetensors`` file.
    """
    root = Path(directory)
    index = root / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: expected a JSON object with a 'weight_map' of "
                                  f"tensor name -> file ({exc})") from None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: 'weight_map' must be a non-empty object")
        files = [root / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{index} lists shards that are not in {root}: "
                                  f"{', '.join(absent)}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{root} has no *.safetensors files")
    return files


def tensor_names(files: list[Path]) -> list[tuple[Path, str]]:
    """``(file, tensor name)`` for every tensor, reading only the files' headers."""
    from safetensors import safe_open

    out: list[tuple[Path, str]] = []
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            out.extend((path, name) for name in f.keys())
    return out


def iter_tensors(files: list[Path], *, desc: str = "Loading weights",
                 progress: bool | None = None) -> Iterator[tuple[str, "torch.Tensor"]]:
    """Yield ``(name, tensor)`` of every tensor of ``files``, as stored (dtype unchanged).

    Files are memory-mapped (``safe_open``); a tensor is read when it is yielded, so a model
    loads while only one tensor is held in memory at a time. A tqdm bar counts the tensors
    (``progress=None``: only on a terminal).
    """
    from safetensors import safe_open
    from tqdm.auto import tqdm

    names = tensor_names(files)
    bar = tqdm(total=len(names), desc=desc, unit="tensor", disable=None if progress is None
               else not progress, leave=False)
    try:
        current: Path | None = None
        handle = None
        for path, name in names:
            if path != current:
                handle = safe_open(str(path), framework="pt", device="cpu")
                current = path
            assert handle is not None
            yield name, handle.get_tensor(name)
            bar.update(1)
    finally:
        bar.close()
