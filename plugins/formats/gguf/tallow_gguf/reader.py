"""Opening GGUF files and split shards through ``gguf.GGUFReader``.

A model may be one ``.gguf`` file or shards written by ``gguf-split``, named
``<stem>-00001-of-0000N.gguf``. The first shard carries the model metadata; every shard carries
some of the tensors. :func:`open_gguf` accepts any shard of a set (or a single file) and returns the
metadata as plain Python values plus an index of every tensor across the shards.
"""

from __future__ import annotations

import functools
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: ``<stem>-00001-of-00003.gguf``: the naming gguf-split uses for shards.
SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


class GGUFFormatError(ValueError):
    """A GGUF source that cannot be read as a model (missing shard, bad metadata, ...)."""


@dataclass
class GGUFModelFile:
    """One GGUF model, possibly split over shards.

    ``metadata`` holds every key/value of the first shard as plain Python values (strings,
    numbers, bools, lists). ``tensors`` maps a tensor name to the ``gguf`` reader's tensor record;
    the readers (memory maps) live as long as this object.
    """

    paths: list[pathlib.Path]
    metadata: dict[str, Any]
    tensors: dict[str, Any]
    readers: list[Any] = field(default_factory=list, repr=False)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise GGUFFormatError(
                f"{self.paths[0]}: metadata key 'general.architecture' is missing or empty; "
                "expected the model family name (e.g. 'llama', 'qwen2')"
            )
        return arch


def shard_paths(path: str | pathlib.Path) -> list[pathlib.Path]:
    """Every file of the model that ``path`` belongs to, in shard order.

    A file not named like a shard is a model on its own. Raises :class:`GGUFFormatError` naming the
    missing shards when the set is incomplete.
    """
    path = pathlib.Path(path)
    match = SHARD_RE.match(path.name)
    if match is None:
        return [path]
    count = int(match["count"])
    if count < 1 or int(match["index"]) < 1 or int(match["index"]) > count:
        raise GGUFFormatError(
            f"{path}: shard number {match['index']} of {match['count']} is invalid")
    width = len(match["index"])
    paths = [
        path.with_name(f"{match['stem']}-{i:0{width}d}-of-{match['count']}.gguf")
        for i in range(1, count + 1)
    ]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise GGUFFormatError(
            f"{path}: the model is split in {count} shards but these are missing from "
            f"{path.parent}: {', '.join(missing)}"
        )
    return paths


def _field_value(reader_field: Any) -> Any:
    """A metadata field as a plain Python value (numpy scalars become int/float/bool)."""
    value = reader_field.contents()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list) and value and isinstance(value[0], np.generic):
        return [v.item() for v in value]
    return value


def read_metadata(reader: Any) -> dict[str, Any]:
    """Every key/value of one reader, without the reader's own ``GGUF.*`` header fields."""
    out: dict[str, Any] = {}
    for name, reader_field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            out[name] = _field_value(reader_field)
        except (UnicodeDecodeError, ValueError) as exc:
            raise GGUFFormatError(f"metadata key {name!r} cannot be decoded: {exc}") from exc
    return out


@functools.lru_cache(maxsize=1)
def _reader_class() -> type:
    from gguf import GGUFReader

    class PlainViewReader(GGUFReader):
        """``GGUFReader`` whose views of the mapped file are plain ndarrays.

        The reader slices its ``np.memmap`` once per string of the vocabulary (hundreds of
        thousands of slices); every memmap slice pays for ``memmap.__array_finalize__``. A plain
        ndarray view of the same mapping reads the same bytes, lazily, at a third of the cost.
        """

        @property  # type: ignore[override]
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainViewReader


def open_gguf(path: str | pathlib.Path) -> GGUFModelFile:
    """Open a GGUF model (one file, or any shard of a split set)."""
    reader_class = _reader_class()
    paths = shard_paths(path)
    readers = []
    for p in paths:
        try:
            readers.append(reader_class(p))
        except (OSError, ValueError) as exc:
            raise GGUFFormatError(
                f"{p}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    metadata = read_metadata(readers[0])
    if len(paths) > 1:
        _check_split(paths, readers, metadata)
    tensors: dict[str, Any] = {}
    for p, reader in zip(paths, readers):
        for tensor in reader.tensors:
            if tensor.name in tensors:
                raise GGUFFormatError(f"{p}: tensor {tensor.name!r} appears in more than one shard")
            tensors[tensor.name] = tensor
    expected = metadata.get("split.tensors.count")
    if isinstance(expected, int) and expected != len(tensors):
        raise GGUFFormatError(
            f"{paths[0]}: split.tensors.count says {expected} tensors, the shards hold "
            f"{len(tensors)}"
        )
    # The split bookkeeping describes the files, not the model.
    for key in ("split.no", "split.count", "split.tensors.count"):
        metadata.pop(key, None)
    return GGUFModelFile(paths, metadata, tensors, readers)


def _check_split(paths: list[pathlib.Path], readers: list[Any], metadata: dict[str, Any]) -> None:
    count = metadata.get("split.count")
    if count is not None and count != len(paths):
        raise GGUFFormatError(
            f"{paths[0]}: split.count is {count} but the file names say {len(paths)} shards"
        )
    for i, (p, reader) in enumerate(zip(paths, readers)):
        shard_no = reader.fields.get("split.no")
        if shard_no is not None and _field_value(shard_no) != i:
            raise GGUFFormatError(
                f"{p}: split.no is {_field_value(shard_no)}, expected {i} from the file name"
            )
