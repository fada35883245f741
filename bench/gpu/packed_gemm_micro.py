"""The packed-weight tensor-core GEMM (``tallow.kernels.packed_gemm``) on llama-3-8b shapes
against bf16, and a sweep of its tiles (GPU; ``--device cpu`` with ``TRITON_INTERPRET=1`` and
``--tiny`` is a dry run of the script's logic).

  python bench/gpu/packed_gemm_micro.py [--kinds int4,q4k,q8_0,fp8,mxfp4] [--rows 1,16,256,4096]
                                        [--shapes qkv,o,gate_up,down] [--sweep]
                                        [--output FILE.json] [--table FILE.json]

For every weight kind, projection and row count M it times, inside a CUDA graph with the
weights rotated through more copies than the L2 holds, the packed GEMM at the default rule's
tiles and bf16 (tallow's dense linear), printing microseconds, effective GB/s (weight bytes /
time) and the ratio. ``--sweep`` also times every tile of :data:`SWEEP` (split-K ones for up to
16 rows) and writes the fastest per (kind, M bucket, N, K) to ``--table`` as entries of
``tallow.kernels.PACKED_GEMM_TUNED`` (``"kind,bucket,n,k"`` -> ``[block_m, block_n,
block_k, split_k, num_warps, num_stages, swap_ab]``), which ``tallow.kernels.packed_layout.
load_tuned_configs`` reads.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from tallow.bench.kernel_timing import L2_ROTATION_BYTES
from tallow.bench.kernel_timing import LLAMA3_8B_SHAPES as SHAPES
from tallow.bench.kernel_timing import graph_seconds

#: name -> (code kind, group, zeros, mins, scale dtype)
KINDS = {
    "int4": ("u4", 128, True, False, torch.float16),
    "q4k": ("u4", 32, False, True, torch.float32),
    "q8_0": ("u8", 32, False, False, torch.float16),
    "fp8": ("fp8", 0, False, False, torch.float32),
    "mxfp4": ("e2m1", 32, False, False, torch.bfloat16),
}
#: tiles the sweep tries: (block_m, block_n, block_k, num_warps, num_stages), each with the
#: split counts of :data:`SPLITS` up to 16 rows, and 16-row tiles also as the transposed
#: product (``swap_ab``)
SWEEP = [
    (16, 32, 128, 4, 4),
    (16, 64, 128, 4, 4),
    (16, 64, 256, 4, 3),
    (16, 128, 128, 4, 3),
    (16, 64, 64, 2, 4),
    (64, 128, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (128, 128, 128, 8, 3),
]
SPLITS = (1, 2, 4, 8, 16)


def random_weight(name: str, n: int, k: int, device: str):
    from tallow.kernels import PackedGemmWeight

    kind, group, zeros, mins, sdtype = KINDS[name]
    group = group or k
    if k % group:  # --tiny shapes
        group = 32
    groups = k // group
    if kind in ("u4", "e2m1"):
        codes = torch.randint(-(2**31), 2**31 - 1, (k // 8, n), dtype=torch.int32, device=device)
    elif kind == "u8":
        codes = torch.randint(0, 256, (k, n), dtype=torch.uint8, device=device)
    else:
        codes = (torch.randn(k, n, device=device) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
    scales = torch.empty(groups, n, device=device).uniform_(1e-3, 1e-2).to(sdtype)
    return PackedGemmWeight(
        kind,
        n,
        k,
        group,
        codes,
        scales,
        torch.randint(0, 16, (groups, n), dtype=torch.uint8, device=device) if zeros else None,
        0.0 if zeros or kind in ("fp8", "e2m1") else (8.0 if kind == "u4" else 128.0),
        torch.rand(groups, n, device=device) * 1e-2 if mins else None,
    )


def main() -> None:
    from tallow.kernels import PackedGemmConfig, packed_gemm, packed_gemm_config
    from tallow.kernels.linear import linear as dense_linear
    from tallow.kernels.packed_gemm import m_bucket

    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--rows", default="1,16,256,4096")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="shapes / 64 (a CPU dry run)")
    ap.add_argument("--output")
    ap.add_argument("--table")
    args = ap.parse_args()
    dev = args.device
    rows = [int(r) for r in args.rows.split(",")]
    results, table = [], {}
    print(
        f"{'kind':6s} {'shape':8s} {'M':>5s} {'packed us':>10s} {'GB/s':>6s} {'bf16 us':>9s} "
        f"{'GB/s':>6s} {'ratio':>6s}",
        flush=True,
    )
    for name, shape in itertools.product(args.kinds.split(","), args.shapes.split(",")):
        n, k = SHAPES[shape]
        if args.tiny:
            n, k = n // 64, k // 64
        w0 = random_weight(name, n, k, dev)
        copies = 1 if dev != "cuda" else max(2, L2_ROTATION_BYTES // w0.nbytes + 1)
        ws = [w0] + [random_weight(name, n, k, dev) for _ in range(copies - 1)]
        dense_copies = 1 if dev != "cuda" else max(2, L2_ROTATION_BYTES // (2 * n * k) + 1)
        dense = [
            torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(dense_copies)
        ]
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            tp = graph_seconds(lambda i: packed_gemm(x, ws[i]), copies, device=dev)
            td = graph_seconds(lambda i: dense_linear(x, dense[i]), dense_copies, device=dev)
            row = {
                "kind": name,
                "shape": shape,
                "n": n,
                "k": k,
                "m": m,
                "packed_us": tp * 1e6,
                "packed_gbs": w0.nbytes / tp / 1e9,
                "bf16_us": td * 1e6,
                "bf16_gbs": 2 * n * k / td / 1e9,
                "config": list(vars(packed_gemm_config(m, n, k, w0.kind)).values()),
            }
            results.append(row)
            print(
                f"{name:6s} {shape:8s} {m:5d} {row['packed_us']:10.1f} "
                f"{row['packed_gbs']:6.0f} {row['bf16_us']:9.1f} {row['bf16_gbs']:6.0f} "
                f"{tp / td:6.2f}",
                flush=True,
            )
            if not args.sweep:
                continue
            best = None
            for (bm, bn, bk, warps, stages), split, swap in itertools.product(
                SWEEP, SPLITS, (False, True)
            ):
                if (
                    (split > 1 and m > 16)
                    or bm > max(16, 2 * m)
                    or (swap and bm > 16)
                    or (w0.group < k and w0.group % bk and bk % w0.group)
                ):
                    continue
                cfg = PackedGemmConfig(bm, bn, bk, split, warps, stages, swap)
                try:
                    t = graph_seconds(
                        lambda i: packed_gemm(x, ws[i], config=cfg), copies, device=dev
                    )
                except Exception as exc:  # a tile that does not compile or fit
                    print(f"    !! {cfg}: {type(exc).__name__}")
                    continue
                results.append({**row, "config": list(vars(cfg).values()), "packed_us": t * 1e6})
                if best is None or t < best[0]:
                    best = (t, cfg)
            if best is not None:
                t, cfg = best
                key = f"{w0.kind},{m_bucket(m)},{n},{k}"
                if key not in table or t < table[key][0]:
                    table[key] = (t, list(vars(cfg).values()))
                print(
                    f"    best {cfg}: {t * 1e6:.1f} us {w0.nbytes / t / 1e9:.0f} GB/s", flush=True
                )
                if args.table:  # after every cell: a sweep cut short keeps what it found
                    with open(args.table, "w") as f:
                        json.dump({key: c for key, (_, c) in table.items()}, f, indent=1)
        ws = dense = None  # free the copies before the next shape
        if dev == "cuda":
            torch.cuda.empty_cache()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
