"""The hub format against tallow's weight-format conformance suite, offline: the download is
replaced by a snapshot directory the test writes (the hub cache layout itself is exercised in
test_hfhub_format.py, in fresh interpreters)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from tallow.plugin.testing import WeightFormatConformance, WrittenCheckpoint
from tallow.plugin.testing.weight_format import tiny_llama_checkpoint
from tallow_format_hfhub import format as hub_format


class TestHFHubConformance(WeightFormatConformance):
    distribution = "tallow-format-hfhub"
    component = "hfhub"

    def write_checkpoint(self, directory: Path) -> WrittenCheckpoint:
        config, tensors = tiny_llama_checkpoint()
        snapshot = directory / "snapshot"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(config))
        save_file(tensors, str(snapshot / "model.safetensors"), metadata={"format": "pt"})
        self.monkeypatch.setattr(
            hub_format, "_download", lambda repo_id, revision, patterns: str(snapshot)
        )
        return WrittenCheckpoint(
            "tiny-org/tiny-llama", tensors, "LlamaForCausalLM", [snapshot / "model.safetensors"]
        )
