"""Embedding requests on the caller's side: inputs to token ids, and pooled vectors to answers.

The engine core pools a request's hidden states into one float32 vector (the model's pooling
and normalization, :class:`tallow.layers.Pooler`); what a request may add on top is handled
here, identically for ``LLM.embed`` and ``POST /v1/embeddings``:

- **inputs** are text (tokenized with the model's special tokens, lowercased first when the
  model's sentence-transformers files say so) or token ids; one longer than the model accepts
  (``max_model_len``) is refused unless the request asks for truncation
  (``truncate_prompt_tokens``: that many tokens, -1 for the model's limit). Text is cut the
  way its tokenizer truncates (the end of the text by default, special tokens kept, as
  transformers and sentence-transformers do); token ids are cut to their first ones.
- **dimensions** shortens a vector to its first ``dimensions`` values and scales it back to
  unit length. It is allowed when the model says it was trained for it (``matryoshka_dimensions``
  in its config: one of those sizes) or, otherwise, when its embeddings are normalized: a
  prefix of a unit vector, normalized again, is what OpenAI's ``dimensions`` returns. Vectors
  that are not normalized have no such reading, so a request for fewer dimensions is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .tokenizer import Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class PoolingParams:
    """What an embedding request asks of the engine beyond its tokens: ``dimensions``, the
    length of the returned vector (None: the model's own; see the module docstring)."""

    dimensions: int | None = None

    def clone(self) -> "PoolingParams":
        return PoolingParams(self.dimensions)


@dataclass(frozen=True)
class EmbeddingInfo:
    """How the served model's embeddings are made, resolved at start-up."""

    pooling: str  # "mean" | "cls" | "last"
    normalize: bool
    #: length of the vectors the model makes
    size: int
    #: sizes the model was trained to be cut to (its config's matryoshka_dimensions), if any
    matryoshka_dimensions: tuple[int, ...] | None = None
    #: input text is lowercased before tokenization (sentence-transformers' do_lower_case)
    lowercase: bool = False

    def dimensions_problem(self, dimensions: int | None) -> str | None:
        """Why ``dimensions`` cannot be served (None when it can, or is not asked for)."""
        if dimensions is None:
            return None
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            return f"expected a positive integer, got {dimensions!r}"
        if dimensions > self.size:
            return f"{dimensions} is more than the model's {self.size} embedding dimensions"
        if self.matryoshka_dimensions:
            if dimensions not in self.matryoshka_dimensions and dimensions != self.size:
                sizes = ", ".join(map(str, self.matryoshka_dimensions))
                return f"this model can be shortened to {sizes} dimensions, not {dimensions}"
            return None
        if not self.normalize:
            return (
                "this model's embeddings are not normalized and it declares no Matryoshka "
                "dimensions, so shortened vectors would have no defined meaning "
                "(model.normalize_embeddings)"
            )
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "pooling": self.pooling,
            "normalize": self.normalize,
            "dimensions": self.size,
            "matryoshka_dimensions": list(self.matryoshka_dimensions or ()) or None,
        }


class InputTooLong(ValueError):
    """An input has more tokens than the model accepts and no truncation was asked for."""

    def __init__(self, num_tokens: int, limit: int) -> None:
        super().__init__(
            f"the input has {num_tokens} tokens, more than this model accepts "
            f"({limit}, model.max_model_len); ask for truncate_prompt_tokens to "
            "cut it"
        )
        self.num_tokens = num_tokens
        self.limit = limit


def truncation_length(truncate_prompt_tokens: int | None, limit: int) -> int | None:
    """The token count inputs are cut to: None (no cutting), ``limit`` for -1. Raises
    ``ValueError`` for other values below 1 and for more than ``limit``."""
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1:
        return limit
    if truncate_prompt_tokens < 1:
        raise ValueError(
            f"expected -1 (the model's limit) or a positive number of tokens, "
            f"got {truncate_prompt_tokens}"
        )
    if truncate_prompt_tokens > limit:
        raise ValueError(
            f"{truncate_prompt_tokens} is more than this model accepts ({limit} "
            "tokens, model.max_model_len)"
        )
    return truncate_prompt_tokens


def input_token_ids(
    tokenizer: Tokenizer,
    info: EmbeddingInfo,
    item: str | Sequence[int],
    limit: int,
    truncate_to: int | None,
) -> list[int]:
    """The token ids of one input (see the module docstring); raises :class:`InputTooLong`."""
    if isinstance(item, str):
        text = item.lower() if info.lowercase else item
        if truncate_to is not None:
            ids = tokenizer.encode_truncated(text, truncate_to)
        else:
            ids = tokenizer.encode(text, add_special_tokens=True)
    else:
        ids = list(item)
        if truncate_to is not None:
            ids = ids[:truncate_to]
    if len(ids) > limit:
        raise InputTooLong(len(ids), limit)
    return ids


def finish_embedding(
    vector: "torch.Tensor", info: EmbeddingInfo, dimensions: int | None
) -> list[float]:
    """The answer for a pooled ``vector``: shortened to ``dimensions`` and normalized again
    when the model's embeddings are normalized."""
    import torch

    if dimensions is not None and dimensions < vector.shape[-1]:
        vector = vector[:dimensions]
        if info.normalize:
            vector = torch.nn.functional.normalize(vector.float(), p=2.0, dim=-1)
    return vector.float().tolist()
