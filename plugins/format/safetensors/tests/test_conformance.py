"""The safetensors format against tallow's weight-format conformance suite: a tiny Llama written
as two shards with an index."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from tallow.plugin.testing import WeightFormatConformance, WrittenCheckpoint
from tallow.plugin.testing.weight_format import tiny_llama_checkpoint


def write_sharded(directory: Path) -> WrittenCheckpoint:
    config, tensors = tiny_llama_checkpoint()
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:5],
        "model-00002-of-00002.safetensors": names[5:],
    }
    for file, members in shards.items():
        save_file(
            {n: tensors[n] for n in members}, str(directory / file), metadata={"format": "pt"}
        )
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {n: f for f, ms in shards.items() for n in ms}})
    )
    return WrittenCheckpoint(
        str(directory), tensors, "LlamaForCausalLM", [directory / f for f in shards]
    )


class TestSafetensorsConformance(WeightFormatConformance):
    distribution = "tallow-format-safetensors"
    component = "safetensors"

    def write_checkpoint(self, directory: Path) -> WrittenCheckpoint:
        return write_sharded(directory)
