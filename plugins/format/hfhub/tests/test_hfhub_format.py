"""The hub weight format, offline: a real hub cache layout under a private HF_HOME.

Loading runs in a fresh interpreter because huggingface_hub reads ``HF_HOME`` when it is
imported; each test gives it its own cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tallow.plugin import WeightFormatRegistry

from tallow_format_hfhub import format as hub_format
from tallow_format_hfhub import plugin
from tallow_format_hfhub.format import METADATA_PATTERNS, HFHubFormat

REPO = "tiny-org/tiny-qwen"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

LOAD = """
import json, sys
from tallow_format_hfhub.format import HFHubFormat
try:
    ck = HFHubFormat().load(sys.argv[1], revision=sys.argv[2] if len(sys.argv) > 2 else None)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
else:
    tensors = dict(ck.tensors())
    print(json.dumps({"architecture": ck.architecture, "source": ck.source,
                      "path": ck.extra["path"], "tokenizer": ck.tokenizer is not None,
                      "sums": {k: float(v.double().sum()) for k, v in tensors.items()}}))
"""


def run_load(hf_home: Path, *args: str) -> dict:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run(
        [sys.executable, "-c", LOAD, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def cache_snapshot(hf_home: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """Put a tiny model into the hub cache layout: snapshots/<commit>/ plus refs/main."""
    transformers = pytest.importorskip("transformers", reason="transformers writes the model")
    repo_dir = hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
    snap = repo_dir / "snapshots" / COMMIT
    config = transformers.Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(snap, safe_serialization=True, max_shard_size="20KB")
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    tied = model.config.tie_word_embeddings
    return snap, {
        k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")
    }  # a tied head is saved once


def test_claims_hub_ids_but_not_local_paths(tmp_path, monkeypatch):
    assert HFHubFormat.claims("Qwen/Qwen2.5-0.5B-Instruct")
    assert HFHubFormat.claims("meta-llama/Llama-3.2-1B")
    for bad in ["model.gguf", "/abs/dir", "a/b/c", "org/", "./org/name", ""]:
        assert not HFHubFormat.claims(bad), bad
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not HFHubFormat.claims("org/name")  # an existing directory is a path


def test_offline_and_not_cached_names_the_repo(tmp_path):
    (tmp_path / "home").mkdir()
    out = run_load(tmp_path / "home", "nobody/nothing-here")
    assert out["error"] == "HubOfflineError"
    assert "'nobody/nothing-here'" in out["message"]
    assert "not in the Hugging Face cache" in out["message"]
    assert "offline" in out["message"]


def test_offline_loads_the_cached_snapshot(tmp_path):
    snap, state = cache_snapshot(tmp_path / "home")
    out = run_load(tmp_path / "home", REPO)
    assert "error" not in out, out
    assert out["architecture"] == "Qwen2ForCausalLM"
    assert out["source"] == REPO and Path(out["path"]) == snap
    expected = {k: float(v.double().sum()) for k, v in state.items()}
    assert out["sums"] == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_unknown_revision_offline_is_refused(tmp_path):
    cache_snapshot(tmp_path / "home")
    out = run_load(tmp_path / "home", REPO, "v9.9")
    assert out["error"] == "HubOfflineError" and "revision 'v9.9'" in out["message"]


def test_only_the_shards_of_the_index_are_fetched(tmp_path, monkeypatch):
    """First the metadata, then the files the index names: a consolidated copy in the same repo
    is never downloaded."""
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "a": "model-00001-of-00002.safetensors",
                    "b": "model-00002-of-00002.safetensors",
                    "c": "model-00001-of-00002.safetensors",
                }
            }
        )
    )
    calls: list[list[str]] = []

    def fake_download(repo_id, revision, patterns):
        calls.append(list(patterns))
        return str(snap)

    monkeypatch.setattr(hub_format, "_download", fake_download)
    assert HFHubFormat().snapshot(REPO, None) == str(snap)
    assert calls == [
        METADATA_PATTERNS,
        ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
    ]
    (snap / "model.safetensors.index.json").unlink()
    calls.clear()
    HFHubFormat().snapshot(REPO, None)
    assert calls[1] == ["*.safetensors"]


def test_registered_below_local_directories():
    """(Entry point, lazy target: tests/test_conformance.py.)"""
    registry = WeightFormatRegistry()
    plugin.tallow_register_weight_formats(registry)
    # below local directories, so a path is never taken for a hub id
    from tallow_format_safetensors import plugin as st_plugin

    st_plugin.tallow_register_weight_formats(registry)
    assert [e.name for e in registry.by_priority()] == ["safetensors", "hfhub"]
