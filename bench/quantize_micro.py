"""Time of the GGML quantizers (``tallow_quant_gguf.quantize``) on the matrices of one
llama-3-8b layer: what in-situ quantization costs per layer at load time.

    python bench/quantize_micro.py [--device cuda] [--types q4_k,q8_0] [--json OUT]

Prints, per type, the seconds for each matrix shape and for a whole layer (q, k, v, o, gate,
up, down), and the projected seconds for 32 layers.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tallow_quant_gguf.quantize import QUANT_TYPES, quantize

#: (rows, cols, count per layer) of llama-3-8b's projections
LAYER = [(4096, 4096, 2), (1024, 4096, 2), (14336, 4096, 2), (4096, 14336, 1)]


def seconds(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--types", default=",".join(QUANT_TYPES))
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    mats = {
        (r, c): torch.randn(r, c, generator=gen, device=device, dtype=torch.bfloat16) * 0.02
        for r, c, _ in LAYER
    }
    results = {}
    for qtype in args.types.split(","):
        quantize(mats[(1024, 4096)][:64], qtype)  # first-use costs
        per_shape = {
            f"{r}x{c}": seconds(lambda m=mats[(r, c)]: quantize(m, qtype), device)
            for r, c, _ in LAYER
        }
        layer = sum(per_shape[f"{r}x{c}"] * n for r, c, n in LAYER)
        results[qtype] = {
            "per_shape_s": per_shape,
            "layer_s": layer,
            "model_32_layers_s": 32 * layer,
        }
        print(
            f"{qtype:6} layer {layer:7.3f} s   32 layers {32 * layer:8.1f} s   "
            + "  ".join(f"{k} {v:.3f}s" for k, v in per_shape.items()),
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": str(device),
                    "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "results": results,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
