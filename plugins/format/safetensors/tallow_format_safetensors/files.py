"""Which ``*.safetensors`` files make up a checkpoint, their checked headers, and reading their
tensors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from tallow.plugin import ModelFileError

from .header import TensorEntry, read_header

if TYPE_CHECKING:  # pragma: no cover
    import torch

INDEX_NAME = "model.safetensors.index.json"


def weight_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The ``*.safetensors`` files of the checkpoint in ``directory``, in load order.

    With ``model.safetensors.index.json`` the files are those its ``weight_map`` names (other
    ``*.safetensors`` beside them, such as a ``consolidated.safetensors`` copy, are not part of
    the checkpoint); every one must exist. Without an index, every ``*.safetensors`` file.
    """
    root = Path(directory)
    index = root / INDEX_NAME
    if index.is_file():
        weight_map = index_weight_map(index)
        files = [root / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise ModelFileError(
                index, "weight_map", f"lists shards that are not in {root}: {', '.join(absent)}"
            )
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ModelFileError(root, None, "has no *.safetensors files")
    return files


def index_weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` (tensor name -> file name) of ``model.safetensors.index.json``."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ModelFileError(
            index,
            "weight_map",
            f"expected a JSON object with a 'weight_map' of tensor name -> file ({exc})",
        ) from None
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(v, str) for v in weight_map.values())
    ):
        raise ModelFileError(
            index, "weight_map", "must be a non-empty object of tensor name -> file name"
        )
    return weight_map


def read_headers(files: list[Path]) -> dict[str, tuple[Path, TensorEntry]]:
    """Every tensor of ``files`` with the file holding it, from their checked headers.

    With ``model.safetensors.index.json`` beside them, its ``weight_map`` must agree with the
    headers. Raises :class:`ModelFileError` naming the file at fault.
    """
    tensors: dict[str, tuple[Path, TensorEntry]] = {}
    for path in files:
        for name, entry in read_header(path).items():
            if name in tensors:
                raise ModelFileError(
                    path, f"tensor {name!r}", f"is also in {tensors[name][0].name}"
                )
            tensors[name] = (path, entry)
    index = files[0].parent / INDEX_NAME if files else None
    if index is not None and index.is_file():
        for name, file in index_weight_map(index).items():
            held = tensors.get(name)
            if held is None or held[0].name != file:
                where = f"is in {held[0].name}" if held else "is in none of its files"
                raise ModelFileError(
                    index, "weight_map", f"places tensor {name!r} in {file}, but it {where}"
                )
    return tensors


def tensor_names(files: list[Path]) -> list[tuple[Path, str]]:
    """``(file, tensor name)`` for every tensor, reading only the files' headers."""
    out: list[tuple[Path, str]] = []
    for path in files:
        with _open(path) as f:
            out.extend((path, name) for name in f.keys())
    return out


def _open(path: Path) -> Any:
    """``safe_open`` of ``path``, its errors naming the file."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except SafetensorError as exc:
        raise ModelFileError(path, "header", str(exc)) from None


def iter_tensors(
    files: list[Path], *, desc: str = "Loading weights", progress: bool | None = None
) -> Iterator[tuple[str, "torch.Tensor"]]:
    """Yield ``(name, tensor)`` of every tensor of ``files``, as stored (dtype unchanged).

    Files are memory-mapped (``safe_open``); a tensor is read when it is yielded, so a model
    loads while only one tensor is held in memory at a time. A tqdm bar counts the tensors
    (``progress=None``: only on a terminal).
    """
    from tqdm.auto import tqdm

    names = tensor_names(files)
    bar = tqdm(
        total=len(names),
        desc=desc,
        unit="tensor",
        disable=None if progress is None else not progress,
        leave=False,
    )
    try:
        current: Path | None = None
        handle = None
        for path, name in names:
            if path != current:
                handle = _open(path)
                current = path
            assert handle is not None
            yield name, handle.get_tensor(name)
            bar.update(1)
    finally:
        bar.close()
