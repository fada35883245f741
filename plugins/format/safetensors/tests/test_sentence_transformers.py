"""The embedding settings of a sentence-transformers directory (modules.json and its modules'
files) as the format reads them into Checkpoint.embedding, and the errors of broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tallow.plugin import EmbeddingSpec, ModelFileError
from tallow_format_safetensors.sentence_transformers import read_embedding_spec

TRANSFORMER = {
    "idx": 0,
    "name": "0",
    "path": "",
    "type": "sentence_transformers.models.Transformer",
}
POOLING = {
    "idx": 1,
    "name": "1",
    "path": "1_Pooling",
    "type": "sentence_transformers.models.Pooling",
}
NORMALIZE = {
    "idx": 2,
    "name": "2",
    "path": "2_Normalize",
    "type": "sentence_transformers.models.Normalize",
}


def _write(
    root: Path, modules: object, pooling: dict | None = None, sbert: dict | None = None
) -> Path:
    (root / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (root / "1_Pooling").mkdir()
        (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if sbert is not None:
        (root / "sentence_bert_config.json").write_text(json.dumps(sbert))
    return root


def test_no_modules_json_says_nothing(tmp_path: Path) -> None:
    assert read_embedding_spec(tmp_path) is None


@pytest.mark.parametrize(
    ("flag", "mode"),
    [
        ("pooling_mode_mean_tokens", "mean"),
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_lasttoken", "last"),
    ],
)
def test_pooling_normalize_and_limits(tmp_path: Path, flag: str, mode: str) -> None:
    _write(
        tmp_path,
        [TRANSFORMER, POOLING, NORMALIZE],
        {"word_embedding_dimension": 8, "pooling_mode_mean_tokens": False, flag: True},
        {"max_seq_length": 128, "do_lower_case": True},
    )
    assert read_embedding_spec(tmp_path) == EmbeddingSpec(
        pooling=mode,
        normalize=True,
        max_seq_length=128,
        lowercase=True,
        source=str(tmp_path / "modules.json"),
    )


def test_without_normalize_or_pooling(tmp_path: Path) -> None:
    _write(tmp_path, [TRANSFORMER])
    assert read_embedding_spec(tmp_path) == EmbeddingSpec(
        pooling=None, normalize=False, source=str(tmp_path / "modules.json")
    )


@pytest.mark.parametrize(
    ("modules", "pooling", "sbert", "where"),
    [
        ("not json", None, None, "not valid JSON"),
        ({"idx": 0}, None, None, "expected a list of modules"),
        (
            [TRANSFORMER, {"type": "sentence_transformers.models.Dense", "path": "2_Dense"}],
            None,
            None,
            "[1].type",
        ),
        (
            [TRANSFORMER, POOLING],
            {"pooling_mode_max_tokens": True},
            None,
            "pooling_mode_max_tokens",
        ),
        (
            [TRANSFORMER, POOLING],
            {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
            None,
            "exactly one",
        ),
        ([TRANSFORMER, POOLING], None, None, "1_Pooling"),
        ([TRANSFORMER], None, {"max_seq_length": "long"}, "max_seq_length"),
    ],
)
def test_broken_files_name_the_file_and_field(
    tmp_path: Path, modules, pooling, sbert, where: str
) -> None:
    if isinstance(modules, str):
        (tmp_path / "modules.json").write_text(modules)
    else:
        _write(tmp_path, modules, pooling, sbert)
    with pytest.raises(ModelFileError) as err:
        read_embedding_spec(tmp_path)
    assert where in str(err.value)


def test_the_format_puts_it_in_the_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import save_file
    import torch

    from tallow_format_safetensors.format import SafetensorsFormat

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    assert SafetensorsFormat().load(str(tmp_path)).embedding is None
    _write(tmp_path, [TRANSFORMER, POOLING], {"pooling_mode_cls_token": True})
    spec = SafetensorsFormat().load(str(tmp_path)).embedding
    assert spec is not None and spec.pooling == "cls" and spec.normalize is False
