"""A weight format for directories holding ``config.json`` (Hugging Face style) and
``model.npz`` (numpy's zip of ``.npy`` arrays, named as Hugging Face names tensors).

``load`` reads the archive's headers (names, dtypes, shapes) without the arrays and refuses a
damaged file with :class:`tallow.plugin.ModelFileError`; ``tensors()`` reads the arrays one at a
time.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, ClassVar, Iterator

import numpy as np
import torch

from tallow.plugin import Checkpoint, ModelFileError, WeightFormat

WEIGHTS = "model.npz"


def read_headers(path: Path) -> dict[str, tuple[int, ...]]:
    """Name → shape of every array in the archive, from the ``.npy`` headers alone."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelFileError(path, None, f"not a readable npz archive ({exc})") from None
    shapes: dict[str, tuple[int, ...]] = {}
    with archive:
        for member in archive.namelist():
            if not member.endswith(".npy"):
                raise ModelFileError(path, f"member {member!r}", "expected only .npy arrays")
            try:
                with archive.open(member) as f:
                    major, _ = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if major == 1
                            else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read(f)
            except Exception as exc:
                raise ModelFileError(path, f"member {member!r}",
                                     f"unreadable array header ({exc})") from None
            if dtype.kind != "f":
                raise ModelFileError(path, f"array {member[:-4]!r}",
                                     f"dtype {dtype} is not a float type")
            shapes[member[:-4]] = tuple(shape)
    return shapes


class NpzFormat(WeightFormat):
    name: ClassVar[str] = "{{ cookiecutter.component_name }}"

    @classmethod
    def claims(cls, source: str) -> bool:
        root = Path(source)
        return (root / "config.json").is_file() and (root / WEIGHTS).is_file()

    def load(self, source: str, *, revision: str | None = None) -> Checkpoint:
        root = Path(source)
        config_path = root / "config.json"
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelFileError(config_path, None, f"not readable JSON ({exc})") from None
        architectures = config.get("architectures")
        if not isinstance(architectures, list) or not architectures:
            raise ModelFileError(config_path, "'architectures'", "must be a non-empty list")
        weights = root / WEIGHTS
        shapes = read_headers(weights)

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            with np.load(weights) as archive:
                for name in shapes:
                    try:
                        array = archive[name]
                    except Exception as exc:
                        raise ModelFileError(weights, f"array {name!r}",
                                             f"unreadable ({exc})") from None
                    yield name, torch.from_numpy(np.array(array))

        tokenizer = None
        if (root / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        tokenizer_config: dict[str, Any] = {}
        if (root / "tokenizer_config.json").is_file():
            tokenizer_config = json.loads((root / "tokenizer_config.json").read_text())
        return Checkpoint(source=source, config=config, architecture=architectures[0],
                          tensors=tensors, naming="hf", tokenizer=tokenizer,
                          tokenizer_config=tokenizer_config, tensor_shapes=shapes,
                          config_path=str(config_path))
