"""The keyword arguments of ``LLM()`` / ``AsyncEngine.create()``: derived from the config
models, the old keywords kept, clear errors; and ``model.tokenizer`` (``tokenizer=``) used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tallow.config import (
    KEYWORDS,
    SECTIONS,
    ConfigError,
    PluginsConfig,
    TallowConfig,
    load_config,
)
from tallow.config.keywords import FLAT_SECTIONS, RESERVED
from tallow.engine.llm import LLM, config_from_kwargs
from tallow import SamplingParams
from tallow.plugin import hookimpl
from tallow.plugin.manager import load_plugins

# The keywords LLM() accepted when its list was kept by hand: each must keep its meaning.
OLD_KEYWORDS = {
    "model": ("model", "source"),
    "dtype": ("model", "dtype"),
    "device": ("model", "device"),
    "revision": ("model", "revision"),
    "max_model_len": ("model", "max_model_len"),
    "seed": ("model", "seed"),
    "served_model_name": ("model", "served_model_name"),
    "weight_format": ("model", "weight_format"),
    "isq": ("model", "isq"),
    "block_size": ("cache", "block_size"),
    "num_blocks": ("cache", "num_blocks"),
    "kv_fraction": ("cache", "kv_fraction"),
    "mem_mb": ("cache", "mem_mb"),
    "kv_codec": ("cache", "kv_codec"),
    "enable_prefix_caching": ("cache", "enable_prefix_caching"),
    "max_num_seqs": ("scheduler", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler", "max_num_batched_tokens"),
    "prefill_chunk_size": ("scheduler", "prefill_chunk_size"),
    "policy": ("scheduler", "policy"),
    "async_scheduling": ("scheduler", "async_scheduling"),
    "attention_backend": ("runner", "attention_backend"),
    "disable_cuda_graph": ("runner", "disable_cuda_graph"),
    "max_cuda_graph_batch": ("runner", "max_cuda_graph_batch"),
}


pytestmark = pytest.mark.usefixtures("no_tallow_env")


def test_old_keywords_keep_their_meaning() -> None:
    for name, (section, field) in OLD_KEYWORDS.items():
        keyword = KEYWORDS[name]
        assert (keyword.section, keyword.field) == (section, field), name


def test_every_setting_is_reachable_by_a_keyword() -> None:
    for section, model in SECTIONS.items():
        for field in model.model_fields:
            flat = [k for k in KEYWORDS.values() if (k.section, k.field) == (section, field)]
            whole = [k for k in KEYWORDS.values() if k.section == section and k.field is None]
            assert flat or whole, f"{section}.{field} has no keyword"
            assert bool(flat) == (section in FLAT_SECTIONS), f"{section}.{field}"
    assert not set(RESERVED) & set(KEYWORDS)
    assert {"tokenizer", "max_waiting", "plugins", "logging"} <= set(KEYWORDS)


def test_keywords_set_flat_fields_and_whole_sections() -> None:
    config = config_from_kwargs(
        model="random:tiny-llama",
        tokenizer="/tok",
        max_waiting=3,
        port=9000,
        plugins={"disable": ["tallow-mcp-client"]},
        logging={"level": "debug"},
    )
    assert (config.model.source, config.model.tokenizer) == ("random:tiny-llama", "/tok")
    assert config.scheduler.max_waiting == 3 and config.server.port == 9000
    assert config.plugins.disable == ["tallow-mcp-client"] and config.logging.level == "DEBUG"
    assert config.plugins.setting_origin("disable") == "config_from_kwargs() keyword plugins"


def test_a_section_model_gives_only_its_given_fields() -> None:
    env = {"TALLOW_PLUGINS__DISABLE": "tallow-mcp-client"}
    config = load_config(env=env, keywords={"plugins": PluginsConfig(autoload=False)})
    assert config.plugins.autoload is False
    assert config.plugins.disable == ["tallow-mcp-client"]  # not given to the model: env stands
    assert config.plugins.setting_origin("disable") == "env TALLOW_PLUGINS__DISABLE"


def test_none_leaves_the_setting_to_lower_sources() -> None:
    env = {"TALLOW_MODEL__SOURCE": "random:tiny-llama", "TALLOW_SCHEDULER__MAX_WAITING": "5"}
    config = load_config(env=env, keywords={"model": None, "max_waiting": None})
    assert config.model.source == "random:tiny-llama" and config.scheduler.max_waiting == 5


@pytest.mark.parametrize(
    "given, close",
    [
        ({"max_num_seq": 1}, "did you mean 'max_num_seqs'?"),
        ({"tokeniser": "x"}, "did you mean 'tokenizer'?"),
        ({"disable": ["tallow-mcp-client"]}, "did you mean plugins={'disable': ...}?"),
        ({"level": "DEBUG"}, "did you mean logging={'level': ...}?"),
        (
            {"zzzz": 1},
            "the keywords are the settings of docs/configuration.md: allowed_image_hosts, ",
        ),
    ],
)
def test_an_unknown_keyword_is_a_type_error_with_close_matches(given: dict, close: str) -> None:
    (name,) = given
    with pytest.raises(TypeError) as info:
        LLM(**given)
    text = str(info.value)
    assert text.startswith(f"LLM() got an unexpected keyword argument {name!r}")
    assert close in text


def test_a_setting_given_twice_is_a_type_error() -> None:
    with pytest.raises(
        TypeError,
        match=r"LLM\(\) got cache.block_size twice: from LLM\(\) "
        r"keyword block_size and from LLM\(\) keyword cache",
    ):
        LLM(block_size=32, cache={"block_size": 16})


def test_bad_values_name_the_keyword() -> None:
    with pytest.raises(ConfigError) as info:
        LLM(block_size=12, plugins=["tallow-mcp-client"])
    text = str(info.value)
    assert (
        "cache.block_size (from LLM() keyword block_size): got 12, expected a power of two" in text
    )
    assert (
        "plugins (from LLM() keyword plugins): got list, expected a mapping of keys to "
        "values or a PluginsConfig" in text
    )


def test_config_from_kwargs_ignores_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("cache: {block_size: 64}\n")
    monkeypatch.setenv("TALLOW_CONFIG", str(path))
    monkeypatch.setenv("TALLOW_SCHEDULER__MAX_WAITING", "5")
    assert config_from_kwargs(max_num_seqs=2) == TallowConfig(scheduler={"max_num_seqs": 2})
    resolved = load_config(keywords={"max_num_seqs": 2})
    assert (resolved.cache.block_size, resolved.scheduler.max_waiting) == (64, 5)


# ---------------------------------------------------------------------------------------------
# model.tokenizer
# ---------------------------------------------------------------------------------------------
WORDS = ["alpha", "beta", "gamma", "delta", "<eos>"]


def save_tokenizer(path: Path, words: list[str]) -> Path:
    """A word-level tokenizer.json (+ tokenizer_config.json) of ``words`` in ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": words[-1]}))
    return path


@pytest.mark.parametrize("source", ["keyword", "env", "config file", "TALLOW_CONFIG"])
def test_model_tokenizer_replaces_the_sources_tokenizer(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny: dict
) -> None:
    tok_dir = save_tokenizer(tmp_path / "tok", WORDS)
    # the model's own (synthetic) tokenizer reads these words as unknown
    assert LLM(**tiny).get_tokenizer().encode("beta gamma delta") != [1, 2, 3]
    keywords: dict[str, Any] = {}
    if source == "keyword":
        keywords["tokenizer"] = str(tok_dir)
    elif source == "env":
        monkeypatch.setenv("TALLOW_MODEL__TOKENIZER", str(tok_dir))
    else:
        path = tmp_path / "tallow.yaml"
        path.write_text(f"model:\n  tokenizer: {tok_dir}\n")
        if source == "TALLOW_CONFIG":
            monkeypatch.setenv("TALLOW_CONFIG", str(path))
        else:
            keywords["config"] = path
    llm = LLM(**tiny, **keywords)
    tok = llm.get_tokenizer()
    assert tok.encode("beta gamma delta") == [1, 2, 3]
    assert tok.eos_token_ids == {4}


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(
    tmp_path: Path, tiny: dict
) -> None:
    tok_dir = save_tokenizer(tmp_path / "big", [f"w{i}" for i in range(600)])
    with pytest.raises(ValueError) as info:
        LLM(**tiny, tokenizer=str(tok_dir))
    assert str(info.value) == (
        f"model.tokenizer {str(tok_dir)!r} (from LLM() keyword tokenizer): the tokenizer has "
        "600 tokens but the model's vocabulary has 512; expected the tokenizer of this model"
    )


def test_a_tokenizer_directory_without_tokenizer_json_is_refused(
    tmp_path: Path, tiny: dict
) -> None:
    with pytest.raises(
        ValueError,
        match=r"model.tokenizer .*: expected a directory containing "
        r"tokenizer.json",
    ):
        LLM(**tiny, tokenizer=str(tmp_path))


def test_config_names_a_file_and_from_config_takes_a_resolved_one(tiny: dict) -> None:
    resolved = config_from_kwargs(**tiny, max_num_seqs=3)
    with pytest.raises(
        TypeError,
        match=r"LLM\(\) config= names a YAML file, got TallowConfig; "
        r"an engine for a TallowConfig is made with "
        r"from_config\(config\)",
    ):
        LLM(config=resolved)
    llm = LLM.from_config(resolved)
    assert llm.config is resolved and llm.engine.core.scheduler.max_num_seqs == 3


class NoTokenizerWeights:
    """A weight format whose checkpoints carry no tokenizer (the random weights' otherwise)."""

    @hookimpl
    def tallow_register_weight_formats(self, registry: Any) -> None:
        from tallow.engine.random_model import RandomWeights

        class Bare(RandomWeights):
            name = "bare"

            @classmethod
            def claims(cls, source: str) -> bool:
                return source.startswith("bare:")

            def load(self, source: str, *, revision: str | None = None) -> Any:
                checkpoint = super().load(source.replace("bare:", "random:"))
                checkpoint.source, checkpoint.tokenizer = source, None
                checkpoint.extra["tokenizer_error"] = "no tokenizer on purpose"
                return checkpoint

        registry.register("bare", Bare, priority=1000)


def test_the_advice_of_a_missing_tokenizer_works(tmp_path: Path, tiny: dict) -> None:
    def plugins() -> Any:
        pm = load_plugins(None, env={})
        pm.add_plugin(NoTokenizerWeights(), "tallow-test-bare", "0.1")
        return pm

    settings = {**tiny, "model": "bare:tiny-llama"}
    with pytest.raises(ValueError) as info:
        LLM(**settings, plugin_manager=plugins())
    assert str(info.value) == (
        "the model source 'bare:tiny-llama' carries no usable tokenizer (no tokenizer on "
        "purpose); set model.tokenizer to a directory with the model's tokenizer.json "
        "(--tokenizer, TALLOW_MODEL__TOKENIZER, tokenizer: in the YAML file's model section, "
        "or LLM(tokenizer=...))"
    )
    tok_dir = save_tokenizer(tmp_path / "tok", WORDS)
    llm = LLM(**settings, tokenizer=str(tok_dir), plugin_manager=plugins())
    out = llm.generate("alpha beta", SamplingParams(max_tokens=3, ignore_eos=True))
    assert out[0].prompt_token_ids == [0, 1] and len(out[0].outputs[0].token_ids) == 3
