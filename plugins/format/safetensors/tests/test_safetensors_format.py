"""The safetensors weight format against what transformers writes with ``save_pretrained``."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers writes the checkpoints")

from tallow.plugin import ModelFileError, WeightFormatRegistry  # noqa: E402

from tallow_format_safetensors import plugin  # noqa: E402
from tallow_format_safetensors.files import iter_tensors, weight_files  # noqa: E402
from tallow_format_safetensors.format import SafetensorsFormat  # noqa: E402

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "paged attention in blocks",
    "def f(x):\n    return x * 2\n",
] * 10


def tiny_model(dtype: torch.dtype = torch.float32):
    config = transformers.Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def test_claims_only_model_directories(tmp_path):
    tiny_model().save_pretrained(tmp_path / "m", safe_serialization=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert SafetensorsFormat.claims(str(tmp_path / "m"))
    assert not SafetensorsFormat.claims(str(tmp_path / "empty"))
    assert not SafetensorsFormat.claims(str(tmp_path / "m" / "config.json"))
    assert not SafetensorsFormat.claims(str(tmp_path / "absent"))
    assert not SafetensorsFormat.claims("Qwen/Qwen2.5-0.5B")


def test_sharded_checkpoint_yields_every_tensor_as_stored(tmp_path):
    model = tiny_model(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    # a stray copy beside the shards is not part of the checkpoint
    (tmp_path / "consolidated.safetensors").write_bytes(
        next(tmp_path.glob("model-*.safetensors")).read_bytes()
    )
    ckpt = SafetensorsFormat().load(str(tmp_path))
    assert ckpt.architecture == "Qwen2ForCausalLM"
    assert ckpt.naming == "hf" and ckpt.config["hidden_size"] == 32
    assert len(ckpt.extra["files"]) > 1
    assert not any(f.endswith("consolidated.safetensors") for f in ckpt.extra["files"])
    got = dict(ckpt.tensors())
    ref = {
        k: v
        for k, v in model.state_dict().items()
        if k != "lm_head.weight" or not model.config.tie_word_embeddings
    }
    assert set(got) == set(ref)
    for name, tensor in ref.items():
        assert got[name].dtype == torch.bfloat16, name
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0)
    # tensors() may be iterated again (a second load, a retry)
    assert sum(1 for _ in ckpt.tensors()) == len(ref)


def test_missing_shard_is_named(tmp_path):
    tiny_model().save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(ModelFileError, match=victim.name):
        SafetensorsFormat().load(str(tmp_path))


def test_config_without_architectures_is_refused(tmp_path):
    tiny_model().save_pretrained(tmp_path, safe_serialization=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="'architectures': must be a non-empty list"):
        SafetensorsFormat().load(str(tmp_path))


def test_tokenizer_chat_template_and_generation_config(tmp_path):
    model = tiny_model()
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=1, temperature=0.7, do_sample=True
    )
    model.save_pretrained(tmp_path, safe_serialization=True)
    hf_tok = tiny_tokenizer()
    hf_tok.save_pretrained(tmp_path)
    ckpt = SafetensorsFormat().load(str(tmp_path))

    assert ckpt.tokenizer is not None
    for text in ["the lazy fox", "def g(y):\n    return y", "blocks of attention <|end|>"]:
        assert ckpt.tokenizer.encode(text, add_special_tokens=False).ids == hf_tok.encode(
            text, add_special_tokens=False
        )
    tc = ckpt.tokenizer_config
    assert (tc["bos_token"], tc["eos_token"]) == ("<s>", "</s>")
    assert ckpt.chat_template == hf_tok.chat_template == CHAT_TEMPLATE
    assert ckpt.generation_config["temperature"] == 0.7
    assert ckpt.generation_config["eos_token_id"] == 1


def test_added_token_objects_and_template_lists_are_normalised(tmp_path):
    tiny_model().save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False},
                "chat_template": [
                    {"name": "default", "template": "A"},
                    {"name": "tool_use", "template": "B"},
                ],
            }
        )
    )
    (tmp_path / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": {"content": "</s>"}, "bos_token": "<ignored>"})
    )
    tc = SafetensorsFormat().load(str(tmp_path)).tokenizer_config
    assert tc["bos_token"] == "<s>" and tc["eos_token"] == "</s>"
    assert tc["chat_template"] == "A" and tc["chat_templates"] == {"default": "A", "tool_use": "B"}


def test_progress_bar_counts_tensors(tmp_path, capsys):
    tiny_model().save_pretrained(tmp_path, safe_serialization=True)
    files = weight_files(tmp_path)
    n = sum(1 for _ in iter_tensors(files, desc="Loading tiny", progress=True))
    err = capsys.readouterr().err
    assert "Loading tiny" in err and f"/{n} " in err  # the bar knows the tensor count


def test_registered_above_hub_ids():
    """(Entry point, lazy target: tests/test_conformance.py.)"""
    registry = WeightFormatRegistry()
    plugin.tallow_register_weight_formats(registry)
    assert registry.entry("safetensors").priority > 0


def test_the_llama_plugin_loads_what_this_format_reads(tmp_path):
    """The format's tensors and config are enough to build and fill the model class."""
    llama = pytest.importorskip(
        "tallow_model_llama.model", reason="tallow-model-llama not installed"
    )
    from tallow.layers import ArchConfig, BuildContext

    model = tiny_model()
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    ckpt = SafetensorsFormat().load(str(tmp_path))
    ours = getattr(llama, ckpt.architecture)(ArchConfig(ckpt.config), BuildContext())
    filled = ours.load_weights(ckpt.tensors(), naming=ckpt.naming)
    assert filled == {n for n, _ in ours.named_parameters()}
    torch.testing.assert_close(
        ours.model.embed_tokens.weight, model.model.embed_tokens.weight, rtol=0, atol=0
    )


def test_headers_are_checked_when_the_checkpoint_is_read(tmp_path):
    """Every shard's header is read (not its tensors) by ``load``: the checkpoint states each
    tensor's shape, and a damaged shard is refused then, naming it, not as the weights load."""
    model = tiny_model(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    ckpt = SafetensorsFormat().load(str(tmp_path))
    assert ckpt.tensor_shapes == {
        k: tuple(v.shape)
        for k, v in model.state_dict().items()
        if k != "lm_head.weight" or not model.config.tie_word_embeddings
    }
    assert ckpt.config_path == str(tmp_path / "config.json")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.write_bytes(victim.read_bytes()[:-3])
    with pytest.raises(
        ModelFileError,
        match=rf"{victim.name}: tensor '.*': data_offsets .* "
        r"the file is truncated",
    ):
        SafetensorsFormat().load(str(tmp_path))


def test_index_and_headers_must_agree(tmp_path):
    tiny_model().save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    files = list(index["weight_map"].values())
    home = next(f for f in files if files.count(f) > 1)  # stays in the checkpoint when moved
    other = next(f for f in files if f != home)
    name = next(n for n, f in index["weight_map"].items() if f == home)
    index["weight_map"][name] = other
    index_path.write_text(json.dumps(index))
    with pytest.raises(
        ModelFileError,
        match=rf"index\.json: weight_map: places tensor '{name}' "
        rf"in {other}, but it is in {home}",
    ):
        SafetensorsFormat().load(str(tmp_path))
