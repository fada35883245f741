"""The int4 matmul (tallow-quant-int4) on llama-3-8b shapes against bf16 (GPU only).

  python bench/gpu/int4_micro.py [--rows 1,16,256,4096] [--shapes qkv,o,gate_up,down,head]
                                 [--gemv-configs] [--asym] [--output FILE.json]

For every projection of llama-3-8b and row count M it times, inside a CUDA graph with the
weights rotated through more copies than the L2 holds (every read comes from HBM), the int4
g128 symmetric matmul the engine runs (``ops.linear``: the small-batch kernel up to 16 rows,
the workspace and cuBLAS above) and bf16 (tallow's dense linear: its GEMV at one row, cuBLAS
otherwise), and prints microseconds and effective GB/s (weight bytes read / time) and the
ratio. ``--gemv-configs`` also times the small-batch kernel's other configurations (weight
rows per program, warps along K) at 1 to 16 rows, the down projection's silu gate fused into
the GEMV against the activation as its own kernel first, and the decoding alone (dequantize
into a workspace) for reference: what a tuned default should be.
"""

from __future__ import annotations

import argparse
import json

import torch

from tallow.bench.kernel_timing import L2_ROTATION_BYTES
from tallow.bench.kernel_timing import LLAMA3_8B_SHAPES as SHAPES
from tallow.bench.kernel_timing import graph_seconds as seconds


def int4_weights(n: int, k: int, copies: int, asym: bool = False) -> list:
    from tallow_quant_int4.layout import IntWeight

    out = []
    for _ in range(copies):
        codes = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32, device="cuda")
        scales = torch.empty(n, k // 128, device="cuda").uniform_(1e-3, 1e-2).half()
        zeros = (
            torch.randint(0, 16, (n, k // 128), dtype=torch.uint8, device="cuda") if asym else None
        )
        out.append(IntWeight(4, 128, n, k, codes, scales, zeros))
    return out


def sweep_gemv(
    launch, m: int, rows_per_program, nbytes: int, copies: int, tags: dict, results: list
) -> None:
    """Times ``launch(i, config)`` for every (BM, BN, warps, prefetch) of ``rows_per_program``
    weight rows and 1 to 8 warps along K, printing and recording each."""
    bm = min(m, 4)
    for bn in rows_per_program:
        for warps in (1, 2, 4, 8):
            try:
                t = seconds(lambda i: launch(i, (bm, bn, warps, True)), copies)
            except Exception as exc:  # a configuration that does not compile
                print(f"    !! BN={bn} warps={warps}: {type(exc).__name__}")
                continue
            results.append({**tags, "m": m, "config": [bm, bn, warps], "us": t * 1e6})
            print(
                f"    gemv BM={bm} BN={bn:2d} warps={warps}: {t * 1e6:8.1f} us "
                f"{nbytes / t / 1e9:6.0f} GB/s",
                flush=True,
            )


def main() -> None:
    from tallow.kernels.linear import linear as dense_linear
    from tallow_quant_int4 import ops
    from tallow_quant_int4.kernels.dequant import dequantize_triton
    from tallow_quant_int4.kernels.gemv import gemv_triton

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,256,4096")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,head")
    ap.add_argument("--gemv-configs", action="store_true")
    ap.add_argument(
        "--asym", action="store_true", help="zero points per group (the default --isq int4 layout)"
    )
    ap.add_argument("--output")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    print(
        f"{'shape':8s} {'M':>5s} {'int4 us':>9s} {'GB/s':>6s} {'bf16 us':>9s} {'GB/s':>6s} "
        f"{'int4/bf16':>9s}",
        flush=True,
    )
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        int4_bytes = n * k // 2 + n * k // 128 * (3 if args.asym else 2)
        copies = max(2, L2_ROTATION_BYTES // int4_bytes + 1)
        ws = int4_weights(n, k, copies, args.asym)
        dense_copies = max(2, L2_ROTATION_BYTES // (2 * n * k) + 1)
        dense = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            for _ in range(dense_copies)
        ]
        ops.warm_up(ws[:1], torch.bfloat16)
        for m in rows:
            if name == "head" and m > 512:
                continue
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            t4 = seconds(lambda i: ops.linear(x, [ws[i]]), copies)
            t16 = seconds(lambda i: dense_linear(x, dense[i]), dense_copies)
            row = {
                "shape": name,
                "n": n,
                "k": k,
                "m": m,
                "int4_us": t4 * 1e6,
                "int4_gbs": int4_bytes / t4 / 1e9,
                "bf16_us": t16 * 1e6,
                "bf16_gbs": 2 * n * k / t16 / 1e9,
            }
            results.append(row)
            print(
                f"{name:8s} {m:5d} {row['int4_us']:9.1f} {row['int4_gbs']:6.0f} "
                f"{row['bf16_us']:9.1f} {row['bf16_gbs']:6.0f} {t4 / t16:9.2f}",
                flush=True,
            )
            if args.gemv_configs and m <= 16:
                sweep_gemv(
                    lambda i, c: gemv_triton(x, ws[i], config=c),
                    m,
                    (2, 4, 8, 16),
                    int4_bytes,
                    copies,
                    {"shape": name},
                    results,
                )
                if name == "down":  # the gated MLP's input: act(gate) * up read by the GEMV
                    xg = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
                    t_fused = seconds(lambda i: ops.linear(xg, [ws[i]], gate="silu"), copies)
                    t_apart = seconds(
                        lambda i: ops.linear(ops.activated(xg, "silu"), [ws[i]]), copies
                    )
                    results.append(
                        {
                            "shape": name,
                            "m": m,
                            "gate_fused_us": t_fused * 1e6,
                            "gate_apart_us": t_apart * 1e6,
                        }
                    )
                    print(
                        f"    silu gate fused into the GEMV: {t_fused * 1e6:8.1f} us, as its "
                        f"own kernel first: {t_apart * 1e6:8.1f} us",
                        flush=True,
                    )
                if m == 1:
                    t = seconds(lambda i: dequantize_triton(ws[i], torch.bfloat16), copies)
                    print(
                        f"    dequantize into a bf16 workspace: {t * 1e6:8.1f} us "
                        f"({(int4_bytes + 2 * n * k) / t / 1e9:.0f} GB/s moved)",
                        flush=True,
                    )
        ws = dense = None  # free the copies before the next shape
        torch.cuda.empty_cache()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
