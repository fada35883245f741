"""Quantized matmul kernels of tallow-quant-gguf on llama-3-8b shapes, against bf16 (GPU only).

  python bench/gpu/quant_micro.py [--types Q4_K,Q8_0,Q6_K] [--rows 1,4,16,256,4096]
                                  [--sweep] [--output FILE.json]

For every projection of llama-3-8b (qkv 4096->6144, o 4096->4096, gate_up 4096->28672,
down 14336->4096, head 4096->128256), every weight type and every row count M it times, each
inside a CUDA graph with the weights rotated through more copies than the L2 holds (every
read comes from HBM):

- ``fused``: the Triton kernel that decodes as it multiplies (the GEMV up to 16 rows, the
  tensor-core GEMM above);
- ``dequant``: the weight decoded into a bf16 workspace, then cuBLAS;
- ``auto``: what the engine runs with the default settings;
- ``bf16``: the dense baseline (tallow's bf16 GEMV at one row, cuBLAS otherwise).

and prints microseconds and effective GB/s (weight bytes read / time) for each, so the
``gemv_max_rows`` / ``dequant_min_rows`` settings and the tile configurations can be tuned
from one run. ``--sweep`` also times tile configurations of the one-row GEMV and the 16-row
kernel and prints the best five per shape.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_decode import _graph_bandwidth  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "head": (128256, 4096)}
L2_ROTATION_BYTES = 400_000_000


def seconds(fn, copies: int) -> float:
    """Device seconds of one ``fn(i)``, replayed in a CUDA graph (see profile_decode)."""
    return 1.0 / _graph_bandwidth(lambda i: fn(i % copies), 1_000_000_000, iters=10)


def packed_weights(qtype: str, n: int, k: int, copies: int) -> list:
    from tallow_quant_gguf.packing import pack
    from tallow_quant_gguf.qtypes import quant_type

    qt = quant_type(qtype)
    out = []
    for _ in range(copies):
        raw = torch.randint(0, 256, (n, qt.row_bytes(k)), dtype=torch.uint8, device="cuda")
        out.append(pack(raw, qt))
        del raw
    return out


def run(args: argparse.Namespace) -> list[dict]:
    from tallow.kernels.linear import linear as bf16_linear
    from tallow_quant_gguf import ops
    from tallow_quant_gguf.kernels.matmul import matmul_config, qmatmul_triton
    from tallow_quant_gguf.scheme import KernelPolicy

    results = []
    rows_list = [int(r) for r in args.rows.split(",")]
    print(f"{'shape':8s} {'type':5s} {'M':>5s} {'fused us':>9s} {'GB/s':>6s} {'dequant us':>10s}"
          f" {'GB/s':>6s} {'auto us':>8s} {'bf16 us':>8s} {'GB/s':>6s} {'auto/bf16':>9s}")
    for (name, (n, k)), qtype in itertools.product(SHAPES.items(), args.types.split(",")):
        dense_bytes = n * k * 2
        dense_copies = max(2, -(-L2_ROTATION_BYTES // dense_bytes))
        dense_ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
                    for _ in range(dense_copies)]
        probe = packed_weights(qtype, n, k, 1)[0]
        q_bytes = probe.nbytes
        q_copies = max(2, -(-L2_ROTATION_BYTES // q_bytes))
        qws = [probe] + packed_weights(qtype, n, k, q_copies - 1)
        for m in rows_list:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            fused = seconds(lambda i: qmatmul_triton(x, qws[i]), q_copies)
            dequant = seconds(lambda i: ops.linear(x, [qws[i]],
                                                   policy=KernelPolicy(matmul="dequant")),
                              q_copies)
            auto = seconds(lambda i: ops.linear(x, [qws[i]]), q_copies)
            dense = seconds(lambda i: bf16_linear(x, dense_ws[i]), dense_copies)
            row = dict(shape=name, n=n, k=k, type=qtype, m=m, weight_bytes=q_bytes,
                       fused_s=fused, dequant_s=dequant, auto_s=auto, bf16_s=dense,
                       auto_kernel=ops.kernel_for(KernelPolicy(), m),
                       fused_config=list(matmul_config(m, n, k)))
            results.append(row)
            print(f"{name:8s} {qtype:5s} {m:5d} {fused * 1e6:9.1f} {q_bytes / fused / 1e9:6.0f} "
                  f"{dequant * 1e6:10.1f} {q_bytes / dequant / 1e9:6.0f} {auto * 1e6:8.1f} "
                  f"{dense * 1e6:8.1f} {dense_bytes / dense / 1e9:6.0f} {auto / dense:9.2f}",
                  flush=True)
            if args.sweep and m in (1, 16):
                row["sweep"] = sweep(x, qws, q_copies, m, n, k)
                best = " ".join(f"{tuple(c)}:{q_bytes / t / 1e9:.0f}"
                                for t, c in row["sweep"][:5])
                print(f"    best tiles (BM, BN, H, warps, stages):GB/s  {best}", flush=True)
        del dense_ws, qws, probe
        torch.cuda.empty_cache()
    return results


def sweep(x, qws, copies: int, m: int, n: int, k: int) -> list:
    from tallow_quant_gguf.kernels.matmul import qmatmul_triton

    if m == 1:
        grid = [(1, bn, h, w, s) for bn in (2, 4, 8) for h in (32, 64, 128)
                for w in (2, 4, 8) for s in (1, 2, 3)]
    else:
        grid = [(16, bn, h, w, s) for bn in (16, 32, 64) for h in (4, 8, 16)
                for w in (4, 8) for s in (2, 3)]
    timed = []
    for cfg in grid:
        if cfg[2] > k // 16:
            continue
        try:
            timed.append((seconds(lambda i: qmatmul_triton(x, qws[i], config=cfg), copies),
                          cfg))
        except Exception as exc:  # a configuration that does not compile (resources): skip
            print(f"    {cfg}: {type(exc).__name__}", flush=True)
    return sorted(timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_K,Q8_0,Q6_K")
    parser.add_argument("--rows", default="1,4,16,256,4096")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--output")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    results = run(args)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
