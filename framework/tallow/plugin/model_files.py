"""The error a weight format raises for a model file that cannot be used as it is."""

from __future__ import annotations

import os


class ModelFileError(ValueError):
    """A damaged or inconsistent model file: which file, which field, what is wrong.

    ``path`` is the file (or directory) at fault, ``field`` the part of it that is wrong
    (``"metadata 'llama.block_count'"``, ``"tensor 'blk.0.attn_q.weight'"``, ``"header"``; None
    when the whole file is at fault) and ``problem`` what is wrong with it::

        model.gguf: metadata 'llama.block_count': 4278190104, but the file holds tensors for
        24 blocks (blk.0 ... blk.23)

    Weight formats raise it from ``load`` before anything is allocated from the file's
    contents, so a corrupt count cannot exhaust memory; the server reports it as a one-line
    start-up error.
    """

    def __init__(self, path: str | os.PathLike[str], field: str | None, problem: str) -> None:
        self.path = os.fspath(path)
        self.field = field
        self.problem = problem
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[type[ModelFileError], tuple[str, str | None, str]]:
        # rebuilt from its parts, so that it crosses process boundaries (workers) intact
        return type(self), (self.path, self.field, self.problem)
