"""The model config against the checkpoint's tensors, before the model is built from it.

The model is allocated from the config — ``num_hidden_layers`` layers of ``hidden_size`` — and
only then filled from the tensors. A corrupt config (a flipped byte in a layer count, an edited
``config.json``) would be allocated as it stands, so the counts that size the model are bounded
here by what the checkpoint's tensor index (:attr:`Checkpoint.tensor_shapes`) can hold:

- the layer count by the layers the tensor names number (``model.layers.<i>.``, ``blk.<i>.``);
- each size (hidden, intermediate, vocabulary, heads, head size) by the largest dimension of
  any tensor, since each is a dimension of some weight or a divisor of one.

These are bounds that no real checkpoint exceeds, not the model's exact shapes (which only
its class knows: that is checked as the weights load). A format knows its own metadata better
and checks it first (GGUF's ``block_count`` against its ``blk.<i>`` tensors, say).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Iterable, Mapping

from tallow.layers import ArchConfig
from tallow.plugin import Checkpoint, ModelFileError

#: a dotted name with a numbered component: ``model.layers.3.mlp...`` -> (``model.layers``, 3)
_NUMBERED = re.compile(r"^(?P<prefix>(?:[^.]+\.)*?[^.]+)\.(?P<index>\d+)(?:\.|$)")
LAYER_KEY = "num_hidden_layers"
SIZE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def numbered_layers(names: Iterable[str]) -> dict[str, int]:
    """Per prefix of a numbered tensor name, how many layers the numbers imply (highest + 1)."""
    highest: dict[str, int] = defaultdict(lambda: -1)
    for name in names:
        match = _NUMBERED.match(name)
        if match:
            prefix = match["prefix"]
            highest[prefix] = max(highest[prefix], int(match["index"]))
    return {prefix: top + 1 for prefix, top in highest.items()}


def check_config_against_tensors(config: Mapping[str, Any], checkpoint: Checkpoint) -> None:
    """Raise :class:`ModelFileError` naming the config key that the tensors cannot hold.

    Nothing is checked when the format gives no tensor index (random weights).
    """
    shapes = checkpoint.tensor_shapes
    if shapes is None:
        return
    if not shapes:
        raise ModelFileError(
            checkpoint.source,
            None,
            "holds no tensors (a vocabulary-only file?); a model cannot be built from it",
        )
    where = checkpoint.config_path or checkpoint.source
    text = ArchConfig(config).text
    layers = text.get(LAYER_KEY)
    if layers is not None:
        if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
            raise ModelFileError(
                where, f"config '{LAYER_KEY}'", f"{layers!r}; expected a positive integer"
            )
        families = numbered_layers(shapes)
        if families:
            prefix, held = max(families.items(), key=lambda item: item[1])
            if layers > held:
                raise ModelFileError(
                    where,
                    f"config '{LAYER_KEY}'",
                    f"{layers}, but the checkpoint's tensors hold {held} "
                    f"layers ({prefix}.0 ... {prefix}.{held - 1})",
                )
    largest = max((d for shape in shapes.values() for d in shape), default=0)
    for key in SIZE_KEYS:
        value = text.get(key)
        # lists (per-layer values) and other shapes of value are the model class's to judge
        if isinstance(value, int) and not isinstance(value, bool) and value > largest:
            raise ModelFileError(
                where,
                f"config '{key}'",
                f"{value} is larger than every dimension of the checkpoint's "
                f"tensors (the largest is {largest:,})",
            )
