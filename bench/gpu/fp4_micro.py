"""The FP4 matmul (tallow-quant-fp4) on llama-3-8b shapes against bf16 (GPU only).

  python bench/gpu/fp4_micro.py [--kinds mxfp4,nvfp4] [--rows 1,4,16,256]
                                [--shapes qkv,o,gate_up,down,head] [--gemv-configs]
                                [--output FILE.json]

For every projection, FP4 kind and row count M it times, inside a CUDA graph with the weights
rotated through more copies than the L2 holds (every read comes from HBM), the matmul the
engine runs (``ops.linear``: the small-batch kernel up to 16 rows with its default launch,
the workspace and cuBLAS above) and bf16 (tallow's dense linear), and prints microseconds,
effective GB/s (codes and scale bytes read / time) and the ratio. ``--gemv-configs`` also
times the small-batch kernel's other configurations (weight rows per program, warps along K)
up to 16 rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int4_micro import sweep_gemv  # noqa: E402

from tallow.bench.kernel_timing import L2_ROTATION_BYTES
from tallow.bench.kernel_timing import LLAMA3_8B_SHAPES as SHAPES
from tallow.bench.kernel_timing import graph_seconds as seconds


def fp4_weights(kind: str, n: int, k: int, copies: int) -> list:
    from tallow_quant_fp4.layout import KINDS, FP4Weight

    group = KINDS[kind]
    out = []
    for _ in range(copies):
        codes = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32, device="cuda")
        if kind == "mxfp4":  # powers of two near 2**-6
            scales = torch.randint(119, 124, (n, k // group), dtype=torch.uint8, device="cuda")
        else:  # e4m3 values from 0.05 to 1 (no NaN bytes)
            scales = (
                (torch.rand(n, k // group, device="cuda") * 0.95 + 0.05)
                .to(torch.float8_e4m3fn)
                .view(torch.uint8)
            )
        out.append(FP4Weight(kind, n, k, codes, scales, 40.0 if kind == "nvfp4" else 1.0))
    return out


def main() -> None:
    from tallow.kernels.linear import linear as dense_linear
    from tallow_quant_fp4 import ops
    from tallow_quant_fp4.kernels.gemv import gemv_config, gemv_triton

    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="mxfp4,nvfp4")
    ap.add_argument("--rows", default="1,4,16,256")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,head")
    ap.add_argument("--gemv-configs", action="store_true")
    ap.add_argument("--output")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    print(
        f"{'kind':6s} {'shape':8s} {'M':>5s} {'fp4 us':>9s} {'GB/s':>6s} {'bf16 us':>9s} "
        f"{'GB/s':>6s} {'fp4/bf16':>9s}  default config",
        flush=True,
    )
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        dense_copies = max(2, L2_ROTATION_BYTES // (2 * n * k) + 1)
        dense = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            for _ in range(dense_copies)
        ]
        for kind in args.kinds.split(","):
            nbytes = n * k // 2 + n * k // (32 if kind == "mxfp4" else 16)
            copies = max(2, L2_ROTATION_BYTES // nbytes + 1)
            ws = fp4_weights(kind, n, k, copies)
            ops.warm_up(ws[:1], torch.bfloat16)
            for m in rows:
                if name == "head" and m > 512:
                    continue
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                t4 = seconds(lambda i: ops.linear(x, [ws[i]]), copies)
                t16 = seconds(lambda i: dense_linear(x, dense[i]), dense_copies)
                default = gemv_config(m, n, k, kind == "nvfp4") if m <= 16 else None
                row = {
                    "kind": kind,
                    "shape": name,
                    "n": n,
                    "k": k,
                    "m": m,
                    "fp4_us": t4 * 1e6,
                    "fp4_gbs": nbytes / t4 / 1e9,
                    "bf16_us": t16 * 1e6,
                    "bf16_gbs": 2 * n * k / t16 / 1e9,
                    "config": default,
                }
                results.append(row)
                print(
                    f"{kind:6s} {name:8s} {m:5d} {row['fp4_us']:9.1f} {row['fp4_gbs']:6.0f} "
                    f"{row['bf16_us']:9.1f} {row['bf16_gbs']:6.0f} {t4 / t16:9.2f}  "
                    f"{default or ''}",
                    flush=True,
                )
                if not (args.gemv_configs and m <= 16):
                    continue
                sweep_gemv(
                    lambda i, c: gemv_triton(x, ws[i], config=c),
                    m,
                    (1, 2, 4, 8),
                    nbytes,
                    copies,
                    {"kind": kind, "shape": name},
                    results,
                )
            ws = None
        dense = None  # free the copies before the next shape
        torch.cuda.empty_cache()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
