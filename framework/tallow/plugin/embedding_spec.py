"""What a checkpoint's own files say about the embeddings it makes.

A weight format that finds such files (a sentence-transformers model directory: its
``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``) puts an
:class:`EmbeddingSpec` in :attr:`tallow.plugin.Checkpoint.embedding`. The engine then serves the
model for embeddings by default (``model.task: auto``) and pools and normalizes as the files say,
unless ``model.pooling`` / ``model.normalize_embeddings`` say otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EmbeddingSpec:
    """How the checkpoint's embeddings are made; None fields are left to the engine.

    ``pooling`` is one of ``mean``, ``cls``, ``last`` (see :mod:`tallow.layers.pooling`);
    ``normalize`` whether the vectors are scaled to unit length; ``max_seq_length`` the longest
    input, in tokens, the model was trained for; ``lowercase`` whether input text is lowercased
    before tokenization; ``source`` the file that said so, for logs and errors.
    """

    pooling: str | None = None
    normalize: bool | None = None
    max_seq_length: int | None = None
    lowercase: bool = False
    source: str = ""
