"""The rotary embedding an HF config describes, in one call.

Every RoPE model reads the same keys (see :func:`~tallow.layers.rope_parameters`: the base,
the scaling, the rotated fraction of each head, under their current, older and GPT-NeoX
spellings) and turns the fraction into a whole number of rotated features the same way;
:func:`rope_from_config` does both so that model plugins do not re-derive them.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .rotary import RotaryEmbedding, get_rope, rope_parameters

#: ``max_position_embeddings`` of a config that does not say (GPT-NeoX's and Llama's default)
DEFAULT_MAX_POSITION = 2048


def rotary_dim(head_dim: int, partial_rotary_factor: float) -> int:
    """How many features of each head rotate: ``int(head_dim * partial_rotary_factor)``, the
    rounding transformers uses (GPT-NeoX's ``rotary_pct``, Phi's ``partial_rotary_factor``).

    Raises ValueError for a fraction outside (0, 1] or a result that is odd or zero, which no
    rotation can use.
    """
    if not 0 < partial_rotary_factor <= 1:
        raise ValueError(
            f"model config: the rotary fraction (partial_rotary_factor / "
            f"rotary_pct) must be in (0, 1], got {partial_rotary_factor}"
        )
    dim = int(head_dim * partial_rotary_factor)
    if dim == 0 or dim % 2:
        raise ValueError(
            f"model config: head_dim {head_dim} * rotary fraction "
            f"{partial_rotary_factor} gives {dim} rotated features; it must be "
            "even and positive"
        )
    return dim


def rope_from_config(
    config: Mapping[str, Any],
    head_dim: int,
    *,
    is_neox_style: bool = True,
    device: torch.device | str | None = None,
) -> RotaryEmbedding:
    """The :class:`~tallow.layers.RotaryEmbedding` of an HF ``config`` for heads of
    ``head_dim`` features: base, scaling and partial rotation from
    :func:`~tallow.layers.rope_parameters`, positions up to ``max_position_embeddings``
    (:data:`DEFAULT_MAX_POSITION` when absent).

    ``is_neox_style`` pairs feature ``i`` with ``i + rotary_dim/2`` (GPT-NeoX, Llama and most
    HF models); False pairs ``2i`` with ``2i+1`` (GPT-J).
    """
    base, scaling, partial = rope_parameters(config)
    max_position = int(config.get("max_position_embeddings") or DEFAULT_MAX_POSITION)
    return get_rope(
        head_dim,
        rotary_dim(head_dim, partial),
        max_position,
        base,
        scaling,
        is_neox_style,
        device=device,
    )
