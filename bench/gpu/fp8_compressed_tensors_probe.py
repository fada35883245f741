"""How far an fp8 compressed-tensors checkpoint's logits land from the float32 CPU reference,
per device and dtype: the test checkpoint of ``plugins/quant/fp8/tests`` (a 3-layer random
llama written by ``compressed-tensors``, presets FP8_DYNAMIC and FP8_BLOCK), one 40-row prompt
(the W8A8 path), each device:dtype given with the GEMV row limit at 16 and 0. Prints the max
absolute difference relative to the reference's largest logit.

    python3 bench/gpu/fp8_compressed_tensors_probe.py cpu:float32 cpu:bfloat16 cuda:bfloat16
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "plugins" / "quant" / "fp8" / "tests"))
PROMPT = [(i * 41 + 7) % 300 + 3 for i in range(40)]  # 40 rows: the W8A8 path


def _logits(directory: Path, device: str, dtype: str, gemv_rows: int) -> torch.Tensor:
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine
    from tallow.plugin.testing.paged_runner import PagedRunner

    eng = LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": str(directory),
                    "device": device,
                    "dtype": dtype,
                    "max_model_len": 128,
                },
                "cache": {"num_blocks": 32},
                "plugins": {"settings": {"tallow-quant-fp8": {"gemv_max_rows": gemv_rows}}},
            }
        )
    )
    runner = PagedRunner(eng.parts.loaded.model)
    runner.add(0)
    return runner.step([(0, PROMPT)])[0].float().cpu()


def main() -> None:
    from fp8_checkpoints import tiny_llama, write_compressed_tensors

    specs = sys.argv[1:] or ["cpu:float32", "cpu:bfloat16"]
    for preset in ("FP8_DYNAMIC", "FP8_BLOCK"):
        directory = Path(tempfile.mkdtemp())
        write_compressed_tensors(tiny_llama(3), preset, directory, list(range(3, 60)))
        logits = {
            (spec, rows): _logits(directory, *spec.split(":"), rows)
            for spec in specs
            for rows in (16, 0)
        }
        ref = logits[specs[0], 16]
        for (spec, rows), got in logits.items():
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            print(
                f"{preset} {spec} gemv_max_rows={rows}: relative error {err:.4f} "
                f"(largest logit {ref.abs().max().item():.3f})"
            )


if __name__ == "__main__":
    main()
