"""Configuration: precedence of the sources, the generated flags, and the error messages."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tallow.config import (
    SECTIONS,
    ConfigError,
    TallowConfig,
    add_config_arguments,
    config_from_mapping,
    dump_config,
    env_var_name,
    load_config,
    setting_flags,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _parser() -> argparse.ArgumentParser:
    return add_config_arguments(argparse.ArgumentParser(prog="tallow-test"))


def _write(tmp_path: Path, text: str, name: str = "tallow.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------
# precedence
# ---------------------------------------------------------------------------------------------
def test_precedence_cli_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    defaults = TallowConfig()
    path = _write(
        tmp_path, "server:\n  port: 1111\n  host: 127.0.0.2\nscheduler:\n  max_num_seqs: 7\n"
    )
    env = {"TALLOW_SERVER__PORT": "2222", "TALLOW_SCHEDULER__MAX_NUM_SEQS": "8"}
    args = _parser().parse_args(["--config", str(path), "--port", "3333"])

    full = load_config(args, env=env)
    assert full.server.port == 3333  # flag beats env and file
    assert full.scheduler.max_num_seqs == 8  # env beats file
    assert full.server.host == "127.0.0.2"  # file beats default
    assert full.cache.block_size == defaults.cache.block_size  # untouched: default

    no_flag = load_config(_parser().parse_args(["--config", str(path)]), env=env)
    assert no_flag.server.port == 2222
    no_env = load_config(_parser().parse_args(["--config", str(path)]), env={})
    assert (no_env.server.port, no_env.scheduler.max_num_seqs) == (1111, 7)
    nothing = load_config(None, env={})
    assert nothing == defaults and nothing.server.port != 1111


def test_config_path_sources(tmp_path: Path) -> None:
    a = _write(tmp_path, "server: {port: 1}\n", "a.yaml")
    b = _write(tmp_path, "server: {port: 2}\n", "b.yaml")
    c = _write(tmp_path, "server: {port: 3}\n", "c.yaml")
    env = {"TALLOW_CONFIG": str(c)}
    assert load_config(None, env=env).server.port == 3
    assert load_config(["--config", str(b)], env=env).server.port == 2
    assert load_config(["--config", str(b)], env=env, path=a).server.port == 1


def test_lists_replace_lower_layers_and_flags_repeat(tmp_path: Path) -> None:
    path = _write(tmp_path, "server:\n  api_keys: [file-key]\n")
    env = {"TALLOW_SERVER__API_KEYS": "env-a, env-b"}
    assert load_config(None, env=env, path=path).server.api_keys == ["env-a", "env-b"]
    cfg = load_config(["--api-key", "k1", "--api-key", "k2"], env=env, path=path)
    assert cfg.server.api_keys == ["k1", "k2"]


def test_env_value_forms() -> None:
    env = {
        "TALLOW_PLUGINS__ENABLE": '["tallow-a", "tallow-b"]',
        "TALLOW_PLUGINS__DISABLE": "tallow-c,tallow-d",
        "TALLOW_PLUGINS__SETTINGS": '{"tallow-a": {"depth": 3}}',
        "TALLOW_PLUGINS__AUTOLOAD": "false",
        "TALLOW_MODEL__MAX_MODEL_LEN": "none",
        "TALLOW_CACHE__KV_FRACTION": "0.5",
        "TALLOW_LOGGING__LEVEL": "debug",
        # switches, not settings: ignored by the config loader
        "TALLOW_PLUGINS": "",
        "TALLOW_TRACE_HOOKS": "1",
    }
    cfg = load_config(None, env=env)
    assert cfg.plugins.enable == ["tallow-a", "tallow-b"]
    assert cfg.plugins.disable == ["tallow-c", "tallow-d"]
    assert cfg.plugins.settings == {"tallow-a": {"depth": 3}}
    assert cfg.plugins.autoload is False
    assert cfg.model.max_model_len is None
    assert cfg.cache.kv_fraction == 0.5
    assert cfg.logging.level == "DEBUG"


def test_boolean_flags_both_ways() -> None:
    on = load_config(
        ["--disable-cuda-graph", "--no-enable-prefix-caching", "--log-json"],
        env={"TALLOW_RUNNER__DISABLE_CUDA_GRAPH": "false"},
    )
    assert on.runner.disable_cuda_graph is True
    assert on.cache.enable_prefix_caching is False
    assert on.logging.json is True
    off = load_config(["--no-disable-cuda-graph"], env={"TALLOW_RUNNER__DISABLE_CUDA_GRAPH": "1"})
    assert off.runner.disable_cuda_graph is False


# ---------------------------------------------------------------------------------------------
# error messages
# ---------------------------------------------------------------------------------------------
def _error(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)
    text = str(info.value)
    for leak in ("validation error", "pydantic", "https://", "Traceback", "For further"):
        assert leak not in text, text
    return text


def test_unknown_key_names_file_key_and_what_was_expected(tmp_path: Path) -> None:
    path = _write(tmp_path, "scheduler:\n  max_num_seq: 3\n")
    text = _error(args=None, env={}, path=path)
    assert f"scheduler.max_num_seq (from file {path})" in text
    assert "unknown key (did you mean 'max_num_seqs'?)" in text
    assert "expected one of: " + ", ".join(SECTIONS["scheduler"].model_fields) in text


def test_bad_value_names_file_key_value_and_expectation(tmp_path: Path) -> None:
    path = _write(tmp_path, "scheduler:\n  max_num_seqs: many\n")
    text = _error(args=None, env={}, path=path)
    assert text.splitlines()[0] == "invalid tallow configuration:"
    assert f"scheduler.max_num_seqs (from file {path}): got 'many', expected an integer" in text


def test_every_problem_is_listed_once_each(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "bogus: 1\ncache:\n  block_size: 12\n  kv_fraction: 2\n"
        "model:\n  device: tpu\n  dtype: float64\n"
        "plugins:\n  require: ['tallow-x>=']\n",
    )
    text = _error(args=["--port", "99999"], env={"TALLOW_SERVER__PROT": "1"}, path=path)
    lines = text.splitlines()[1:]
    assert len(lines) == 8, text
    expected = {
        "bogus": "unknown key; expected one of: " + ", ".join(SECTIONS),
        "cache.block_size": "got 12, expected a power of two",
        "cache.kv_fraction": "got 2, expected less than or equal to 1",
        "model.device": "got 'tpu', expected auto, cpu, cuda or cuda:N",
        "model.dtype": "got 'float64', expected one of 'auto', 'float32', 'bfloat16' or 'float16'",
        "plugins.require": "expected a distribution name with optional version specifiers",
        "server.port": "got '99999', expected less than or equal to 65535",
        "server.prot": "unknown key (did you mean TALLOW_SERVER__PORT?)",
    }
    for key, message in expected.items():
        line = next((ln for ln in lines if ln.startswith(f"  - {key} ")), None)
        assert line is not None and message in line, (key, text)
    assert "(from flag --port)" in text and "(from env TALLOW_SERVER__PROT)" in text


def test_env_errors_name_the_variable() -> None:
    text = _error(
        args=None, env={"TALLOW_SCHEDULR__MAX_NUM_SEQS": "1", "TALLOW_SERVER__MAX_QUEUE": "lots"}
    )
    assert "(from env TALLOW_SCHEDULR__MAX_NUM_SEQS): unknown section 'schedulr'" in text
    assert "did you mean TALLOW_SCHEDULER__MAX_NUM_SEQS?" in text
    assert (
        "server.max_queue (from env TALLOW_SERVER__MAX_QUEUE): got 'lots', expected an "
        "integer" in text
    )
    text = _error(args=None, env={"TALLOW_PLUGINS__SETTINGS": "{not json"})
    assert "plugins.settings (from env TALLOW_PLUGINS__SETTINGS): expected a JSON object" in text


def test_unreadable_files_are_clear(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert f"cannot read config file {missing}" in _error(args=None, env={}, path=missing)
    bad = _write(tmp_path, "server:\n  port: [1,\n", "bad.yaml")
    text = _error(args=None, env={}, path=bad)
    assert f"config file {bad} is not valid YAML at line" in text
    scalar = _write(tmp_path, "just a string\n", "scalar.yaml")
    assert "must be a mapping of sections (model, cache" in _error(args=None, env={}, path=scalar)
    section = _write(tmp_path, "cache: 5\n", "section.yaml")
    assert "cache (from file" in _error(args=None, env={}, path=section)
    assert load_config(None, env={}, path=_write(tmp_path, "", "empty.yaml")) == TallowConfig()


def test_programmatic_configs_forbid_unknown_keys() -> None:
    with pytest.raises(ConfigError, match=r"runner.backend \(from tests\): unknown key"):
        config_from_mapping({"runner": {"backend": "x"}}, origin="tests")
    with pytest.raises(Exception):
        TallowConfig(runner={"backend": "x"})
    cfg = config_from_mapping({"runner": {"attention_backend": "triton"}})
    assert cfg.runner.attention_backend == "triton"


# ---------------------------------------------------------------------------------------------
# flags, dump, docs
# ---------------------------------------------------------------------------------------------
def test_every_setting_has_a_flag_but_settings_mappings() -> None:
    flags = {f"{s}.{n}": flag for s, n, flag, _ in setting_flags()}
    assert {k for k, f in flags.items() if f is None} == {"plugins.settings"}
    for flag in (
        "--model",
        "--dtype",
        "--device",
        "--block-size",
        "--kv-fraction",
        "--mem",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--prefill-chunk-size",
        "--attention-backend",
        "--disable-cuda-graph",
        "--host",
        "--port",
        "--api-key",
        "--tool-parser",
        "--num-blocks",
        "--kv-codec",
        "--seed",
        "--max-model-len",
        "--served-model-name",
        "--weight-format",
        "--revision",
        "--tokenizer",
        "--enable-prefix-caching",
        "--scheduling-policy",
        "--max-waiting",
        "--max-cuda-graph-batch",
        "--max-body-bytes",
        "--max-queue",
        "--autoload-plugins",
        "--enable-plugin",
        "--disable-plugin",
        "--require-plugin",
        "--log-level",
        "--log-json",
    ):
        assert flag in flags.values(), flag
    assert len(set(flags.values())) == len(flags)  # no two settings share a flag
    options = _parser()._option_string_actions
    for flag in filter(None, flags.values()):
        assert flag in options
    assert "--config" in options


def test_flags_cover_every_field_and_parse() -> None:
    cfg = load_config(
        [
            "--model",
            "/models/x.gguf",
            "--dtype",
            "bfloat16",
            "--device",
            "cuda:1",
            "--mem",
            "512",
            "--block-size",
            "32",
            "--max-num-seqs",
            "4",
            "--scheduling-policy",
            "priority",
            "--require-plugin",
            "tallow-model-llama>=0.1",
            "--log-level",
            "warning",
        ],
        env={},
    )
    assert cfg.model.source == "/models/x.gguf" and cfg.model.dtype == "bfloat16"
    assert cfg.model.device == "cuda:1" and cfg.cache.mem_mb == 512
    assert cfg.cache.block_size == 32 and cfg.scheduler.max_num_seqs == 4
    assert cfg.scheduler.policy == "priority"
    assert cfg.plugins.require == ["tallow-model-llama>=0.1"] and cfg.logging.level == "WARNING"


def test_dump_redacts_api_keys() -> None:
    cfg = load_config(["--api-key", "sekrit"], env={})
    assert dump_config(cfg)["server"]["api_keys"] == ["***"]
    assert dump_config(cfg, redact=False)["server"]["api_keys"] == ["sekrit"]
    assert "sekrit" not in str(dump_config(cfg))


def test_every_setting_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for section, name, flag, info in setting_flags():
        assert info.description, f"{section}.{name} has no description"
        for needle in (f"`{section}.{name}`", f"`{env_var_name(section, name)}`"):
            assert needle in text, f"docs/configuration.md lacks {needle}"
        if flag:
            assert f"`{flag}`" in text, f"docs/configuration.md lacks {flag}"


def test_expert_parallel_flag_keyword_and_environment() -> None:
    assert load_config([], env={}).parallel.enable_expert_parallel is False
    assert load_config(["--enable-expert-parallel"], env={}).parallel.enable_expert_parallel
    env = {"TALLOW_PARALLEL__ENABLE_EXPERT_PARALLEL": "true"}
    assert load_config([], env=env).parallel.enable_expert_parallel
    assert not load_config(["--no-enable-expert-parallel"], env=env).parallel.enable_expert_parallel
