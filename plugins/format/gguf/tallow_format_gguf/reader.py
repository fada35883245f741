"""Opening GGUF files and split shards.

A model may be one ``.gguf`` file or shards written by ``gguf-split``, named
``<stem>-00001-of-0000N.gguf``. The first shard carries the model metadata; every shard carries
some of the tensors. :func:`open_gguf` accepts any shard of a set (or a single file) and returns the
metadata as plain Python values plus an index of every tensor across the shards, each file read
by :func:`tallow_format_gguf.header.read_header` (every count and offset checked against the file) and
the whole checked for agreement between metadata and tensors (:mod:`tallow_format_gguf.consistency`).
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass, field
from typing import Any

from tallow.plugin import ModelFileError

from .consistency import check_metadata_against_tensors, check_vocabulary
from .header import GGUFHeader, GGUFTensor, read_header

#: ``<stem>-00001-of-00003.gguf``: the naming gguf-split uses for shards.
SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass
class GGUFModelFile:
    """One GGUF model, possibly split over shards.

    ``metadata`` holds every key/value of the first shard as plain Python values (strings,
    numbers, bools, lists). ``tensors`` maps a tensor name to its :class:`GGUFTensor` (its data a
    view of the file's memory map); ``headers`` are the shards' headers.
    """

    paths: list[pathlib.Path]
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    headers: list[GGUFHeader] = field(default_factory=list, repr=False)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ModelFileError(
                self.paths[0],
                "metadata 'general.architecture'",
                "missing or empty; expected the model family name (e.g. 'llama', 'qwen2')",
            )
        return arch


def shard_paths(path: str | pathlib.Path) -> list[pathlib.Path]:
    """Every file of the model that ``path`` belongs to, in shard order.

    A file not named like a shard is a model on its own. Raises :class:`ModelFileError` naming the
    missing shards when the set is incomplete.
    """
    path = pathlib.Path(path)
    match = SHARD_RE.match(path.name)
    if match is None:
        return [path]
    count = int(match["count"])
    if count < 1 or int(match["index"]) < 1 or int(match["index"]) > count:
        raise ModelFileError(
            path, "file name", f"shard number {match['index']} of {match['count']} is invalid"
        )
    width = len(match["index"])
    paths = [
        path.with_name(f"{match['stem']}-{i:0{width}d}-of-{match['count']}.gguf")
        for i in range(1, count + 1)
    ]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ModelFileError(
            path,
            None,
            f"the model is split in {count} shards but these are "
            f"missing from {path.parent}: {', '.join(missing)}",
        )
    return paths


def open_gguf(path: str | pathlib.Path) -> GGUFModelFile:
    """Open a GGUF model (one file, or any shard of a split set).

    Raises :class:`ModelFileError` naming the file and the field when a file is damaged or its
    metadata disagrees with its tensors.
    """
    paths = shard_paths(path)
    headers = [read_header(p) for p in paths]
    metadata = dict(headers[0].metadata)
    if len(paths) > 1:
        _check_split(headers)
    tensors: dict[str, GGUFTensor] = {}
    for header in headers:
        for name, tensor in header.tensors.items():
            if name in tensors:
                raise ModelFileError(
                    header.path, f"tensor {name!r}", "appears in more than one shard"
                )
            tensors[name] = tensor
    expected = metadata.get("split.tensors.count")
    if isinstance(expected, int) and expected != len(tensors):
        raise ModelFileError(
            paths[0],
            "metadata 'split.tensors.count'",
            f"{expected}, but the shards hold {len(tensors)} tensors",
        )
    # The split bookkeeping describes the files, not the model.
    for key in ("split.no", "split.count", "split.tensors.count"):
        metadata.pop(key, None)
    check_vocabulary(paths[0], metadata)
    check_metadata_against_tensors(paths[0], metadata, tensors)
    return GGUFModelFile(paths, metadata, tensors, headers)


def _check_split(headers: list[GGUFHeader]) -> None:
    count = headers[0].metadata.get("split.count")
    if count is not None and count != len(headers):
        raise ModelFileError(
            headers[0].path,
            "metadata 'split.count'",
            f"{count}, but the file names say {len(headers)} shards",
        )
    for i, header in enumerate(headers):
        shard_no = header.metadata.get("split.no")
        if shard_no is not None and shard_no != i:
            raise ModelFileError(
                header.path, "metadata 'split.no'", f"{shard_no}, expected {i} from the file name"
            )
