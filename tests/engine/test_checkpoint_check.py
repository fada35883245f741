"""The engine's check of a model config against the checkpoint's tensor index (before the model
is built), and the error type that reports a damaged model file."""

from __future__ import annotations

import pickle

import pytest

from tallow.engine.checkpoint_check import check_config_against_tensors, numbered_layers
from tallow.plugin import Checkpoint, ModelFileError

LLAMA_SHAPES = {
    "model.embed_tokens.weight": (320, 64),
    **{f"model.layers.{i}.self_attn.q_proj.weight": (64, 64) for i in range(3)},
    **{
        f"model.layers.{i}.mlp.experts.{e}.up_proj.weight": (128, 64)
        for i in range(3)
        for e in range(8)
    },
    "lm_head.weight": (320, 64),
}
CONFIG = {
    "num_hidden_layers": 3,
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": 320,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def checkpoint(shapes, config_path: str | None = "/m/config.json") -> Checkpoint:
    return Checkpoint(
        source="/m",
        config={},
        architecture="X",
        tensors=lambda: iter(()),
        tensor_shapes=shapes,
        config_path=config_path,
    )


def test_numbered_layers_takes_the_first_number_of_each_name():
    assert numbered_layers(LLAMA_SHAPES) == {"model.layers": 3}
    assert numbered_layers(
        ["blk.0.attn_q.weight", "blk.23.ffn_up.weight", "output.weight", "v.blk.30.attn_q.weight"]
    ) == {"blk": 24, "v.blk": 31}


def test_a_config_the_tensors_can_hold_passes():
    check_config_against_tensors(CONFIG, checkpoint(LLAMA_SHAPES))
    # a multimodal config is judged by its text part
    check_config_against_tensors(
        {"text_config": CONFIG, "vision_config": {"hidden_size": 10**9}}, checkpoint(LLAMA_SHAPES)
    )
    # per-layer lists are the model class's to judge
    check_config_against_tensors(
        {**CONFIG, "num_key_value_heads": [2, 2, 2]}, checkpoint(LLAMA_SHAPES)
    )
    # without a tensor index (random weights) nothing is checked
    check_config_against_tensors({**CONFIG, "num_hidden_layers": 10**9}, checkpoint(None))


@pytest.mark.parametrize(
    "key, value, match",
    [
        (
            "num_hidden_layers",
            4_278_190_104,
            r"/m/config\.json: config 'num_hidden_layers': "
            r"4278190104, but the checkpoint's tensors hold 3 "
            r"layers \(model\.layers\.0 \.\.\. model\.layers\.2\)",
        ),
        ("num_hidden_layers", 0, r"'num_hidden_layers': 0; expected a positive integer"),
        ("num_hidden_layers", "3", r"'num_hidden_layers': '3'; expected a positive integer"),
        (
            "hidden_size",
            2**31,
            r"'hidden_size': 2147483648 is larger than every dimension of the "
            r"checkpoint's tensors \(the largest is 320\)",
        ),
        ("vocab_size", 321, r"'vocab_size': 321"),
        ("num_attention_heads", 10**6, r"'num_attention_heads'"),
    ],
)
def test_a_count_the_tensors_cannot_hold_names_the_config_key(key, value, match):
    with pytest.raises(ModelFileError, match=match) as info:
        check_config_against_tensors({**CONFIG, key: value}, checkpoint(LLAMA_SHAPES))
    assert info.value.path == "/m/config.json" and info.value.field == f"config '{key}'"


def test_a_checkpoint_without_tensors_is_refused_naming_its_source():
    with pytest.raises(ModelFileError, match=r"^/m: holds no tensors"):
        check_config_against_tensors(CONFIG, checkpoint({}, config_path=None))


def test_model_file_error_parts_message_and_pickling():
    error = ModelFileError("/x/model.gguf", "metadata 'llama.block_count'", "7, but ...")
    assert str(error) == "/x/model.gguf: metadata 'llama.block_count': 7, but ..."
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.field, copy.problem, str(copy)) == (
        error.path,
        error.field,
        error.problem,
        str(error),
    )
    assert str(ModelFileError("/x", None, "is not a directory")) == "/x: is not a directory"
