"""The embedding settings of a sentence-transformers model directory.

Such a directory is a Hugging Face model directory plus ``modules.json``, the pipeline applied
to the model's hidden states: ``Transformer`` (the model itself), ``Pooling`` (its settings in
``<path>/config.json``) and ``Normalize``. ``sentence_bert_config.json`` holds the longest input
the model was trained for and whether text is lowercased first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tallow.plugin import EmbeddingSpec, ModelFileError

from .tokenizer_files import read_json

#: pooling flags of 1_Pooling/config.json → tallow's pooling mode
_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_UNSUPPORTED_MODES = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)
_MODULES = ("Transformer", "Pooling", "Normalize")


def _modules(path: Path) -> list[dict[str, Any]]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ModelFileError(path, None, f"not valid JSON ({exc})") from None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise ModelFileError(path, None, 'expected a list of modules ({"type", "path", ...})')
    return data


def _pooling_mode(path: Path) -> str:
    config = read_json(path)
    if not config:
        raise ModelFileError(
            path,
            None,
            "is missing or empty; expected the Pooling module's "
            "settings (pooling_mode_mean_tokens, ...)",
        )
    for key in _UNSUPPORTED_MODES:
        if config.get(key):
            raise ModelFileError(
                path,
                key,
                "this pooling is not supported (tallow pools by mean, CLS token or last token)",
            )
    chosen = [mode for key, mode in _MODES.items() if config.get(key)]
    if len(chosen) != 1:
        raise ModelFileError(
            path, None, f"expected exactly one of {', '.join(_MODES)} to be true, got {len(chosen)}"
        )
    return chosen[0]


def read_embedding_spec(root: Path) -> EmbeddingSpec | None:
    """The :class:`EmbeddingSpec` of the sentence-transformers files in ``root``, or None when
    it has no ``modules.json``. Modules other than Transformer, Pooling and Normalize (a Dense
    projection, say) are refused with a :class:`ModelFileError` naming them."""
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        return None
    pooling, normalize = None, False
    for i, module in enumerate(_modules(modules_file)):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            pooling = _pooling_mode(root / str(module.get("path") or "") / "config.json")
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ModelFileError(
                modules_file,
                f"[{i}].type",
                f"module {module.get('type')!r} is not supported (tallow "
                f"applies {', '.join(_MODULES)})",
            )
    sbert_file = root / "sentence_bert_config.json"
    sbert = read_json(sbert_file)
    max_len = sbert.get("max_seq_length")
    if max_len is not None and (
        not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1
    ):
        raise ModelFileError(
            sbert_file, "max_seq_length", f"expected a positive integer, got {max_len!r}"
        )
    return EmbeddingSpec(
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_len,
        lowercase=bool(sbert.get("do_lower_case", False)),
        source=str(modules_file),
    )
