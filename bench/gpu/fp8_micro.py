"""FP8 matmuls (tallow-quant-fp8) on llama-3-8b shapes, against bf16 (GPU only).

  python bench/gpu/fp8_micro.py [--rows 1,16,256,4096] [--shapes qkv,o,gate_up,down,head]
                                [--sweep-gemv] [--output FILE.json]

For every projection of llama-3-8b (qkv 4096->6144, o 4096->4096, gate_up 4096->28672,
down 14336->4096, head 4096->128256) and row count M it times, each inside a CUDA graph with
the weights rotated through more copies than the L2 holds (every weight read comes from HBM):

- ``bf16``: tallow's dense product (its Triton GEMV at one row, cuBLAS otherwise);
- ``engine``: what the fp8 scheme runs for an ``--isq fp8`` layer (per-row scales, activations
  per token): the weight-only GEMV up to 16 rows, quantization + ``torch._scaled_mm`` beyond;
- its parts and alternatives: ``gemv`` (weight-only, M <= 16), ``quant`` (activations to e4m3
  alone), ``scaled_mm`` (cuBLAS on already quantized activations), ``scaled_mm_fast``
  (``use_fast_accum``), ``quant+scaled_mm``, ``quant+triton`` (the Triton W8A8 GEMM),
  ``triton_w8`` (the Triton weights-only GEMM);
- block-wise weights (128 x 128, activations per 128 columns): ``block_gemv``,
  ``block_quant+scaled_mm`` (if this torch multiplies block scales; else the reason is
  printed), ``block_quant+triton``.

It prints microseconds, the effective weight bandwidth (weight bytes / time) and the ratio to
bf16, and answers whether ``torch._scaled_mm`` is fast at one row. ``--sweep-gemv`` also times
the one-row GEMV's configurations (rows per program, columns per step, warps) per shape.

``--device cpu`` with ``TRITON_INTERPRET=1`` and small shapes (``--shapes tiny=256:512``) runs
the script's logic on a CPU, timed by the wall clock: a dry run, not a measurement.
"""

from __future__ import annotations

import argparse
import json

import torch

from tallow.bench.kernel_timing import L2_ROTATION_BYTES, graph_seconds
from tallow.bench.kernel_timing import LLAMA3_8B_SHAPES as SHAPES

GEMV_CONFIGS = [
    (1, bn, bk, w) for bn in (2, 4, 8, 16) for bk in (512, 1024, 2048, 4096) for w in (2, 4, 8)
]
DEVICE = "cuda"


def seconds(fn, copies: int, iters: int = 10) -> float:
    return graph_seconds(fn, copies, iters, DEVICE)


def weights(n: int, k: int, copies: int, block: bool) -> list:
    from tallow_quant_fp8.weights import BLOCK, Fp8Weight, quantize_rows

    out = []
    for _ in range(copies):
        w = quantize_rows(torch.randn(n, k, device=DEVICE) * k**-0.5)
        if block:
            scale = w.scale[::BLOCK, None].expand(-1, -(-k // BLOCK)).contiguous()
            w = Fp8Weight(w.data, scale, "block")
        out.append(w)
    return out


def cell(
    name: str, n: int, k: int, m: int, fp8: list, blocks: list, dense: list, results: dict
) -> dict:
    from tallow.kernels.linear import linear as bf16_linear
    from tallow_quant_fp8 import ops
    from tallow_quant_fp8.kernels.gemm import gemm_triton
    from tallow_quant_fp8.kernels.gemv import gemv_triton
    from tallow_quant_fp8.kernels.quantize import quantize_activations_triton
    from tallow_quant_fp8.ops import LayerPlan
    from tallow_quant_fp8.scaled_mm import scaled_mm, scaled_mm_serves
    from tallow_quant_fp8.settings import Fp8Settings

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x = torch.randn(m, k, device=DEVICE, dtype=dtype)
    q_copies, d_copies = len(fp8), len(dense)
    row = dict(shape=name, n=n, k=k, m=m, fp8_bytes=n * k, bf16_bytes=2 * n * k)
    t = row["times_us"] = {}

    def timed(label, fn, copies):
        try:
            t[label] = seconds(fn, copies) * 1e6
        except Exception as exc:  # a path this torch or GPU does not take
            row.setdefault("errors", {})[label] = f"{type(exc).__name__}: {exc}"[:300]

    timed("bf16", lambda i: bf16_linear(x, dense[i]), d_copies)
    cublas = DEVICE == "cuda" and scaled_mm_serves(fp8[0], dtype) is None
    plan = LayerPlan("token", scaled_mm=cublas)
    settings = Fp8Settings()
    timed("engine", lambda i: ops.linear(x, fp8[i], plan, settings=settings), q_copies)
    if m <= 16:
        timed("gemv", lambda i: gemv_triton(x, fp8[i]), q_copies)
        timed("block_gemv", lambda i: gemv_triton(x, blocks[i]), q_copies)
    q, s = quantize_activations_triton(x)
    timed("quant", lambda i: quantize_activations_triton(x), 1)
    if cublas:
        timed("scaled_mm", lambda i: scaled_mm(q, s, fp8[i], None, dtype), q_copies)
        timed("scaled_mm_fast", lambda i: scaled_mm(q, s, fp8[i], None, dtype, True), q_copies)
        timed(
            "quant+scaled_mm",
            lambda i: scaled_mm(*quantize_activations_triton(x), fp8[i], None, dtype),
            q_copies,
        )
    timed("quant+triton", lambda i: triton_w8a8(x, fp8[i], dtype), q_copies)
    timed("triton_w8", lambda i: gemm_triton(x, fp8[i]), q_copies)
    block_reason = scaled_mm_serves(blocks[0], dtype) if DEVICE == "cuda" else "no CUDA"
    if block_reason is None:
        timed(
            "block_quant+scaled_mm",
            lambda i: scaled_mm(
                *quantize_activations_triton(
                    x, group=128, scales_column_major=True, row_multiple=4
                ),
                blocks[i],
                None,
                dtype,
            )[:m],
            q_copies,
        )
    else:
        results.setdefault("block_scaled_mm_refused", block_reason)
    timed("block_quant+triton", lambda i: triton_w8a8(x, blocks[i], dtype, 128), q_copies)
    return row


def triton_w8a8(x: torch.Tensor, weight, dtype: torch.dtype, group: int | None = None):
    """Activations quantized, then the Triton W8A8 GEMM."""
    from tallow_quant_fp8.kernels.gemm import gemm_triton
    from tallow_quant_fp8.kernels.quantize import quantize_activations_triton

    q, s = quantize_activations_triton(x, group=group)
    return gemm_triton(q, weight, a_scales=s, out_dtype=dtype)


def sweep_gemv(name: str, n: int, k: int, fp8: list, blocks: list) -> dict:
    from tallow_quant_fp8.kernels.gemv import gemv_config, gemv_triton

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x = torch.randn(1, k, device=DEVICE, dtype=dtype)
    out = {}
    for label, ws in (("row", fp8), ("block", blocks)):
        timed = []
        for config in GEMV_CONFIGS:
            _, bn, bk, _ = config
            if bk > k or (label == "block" and 128 % bn):
                continue
            try:
                timed.append(
                    (seconds(lambda i: gemv_triton(x, ws[i], config=config), len(ws)), config)
                )
            except Exception as exc:  # e.g. registers or shared memory over the limit
                print(f"    !! {name} {label} {config}: {type(exc).__name__}: {exc}"[:200])
        timed.sort()
        default = gemv_config(1, n, k, label == "block")
        out[label] = dict(
            default=list(default),
            default_us=next((t * 1e6 for t, c in timed if c == default), None),
            best=[(t * 1e6, list(c)) for t, c in timed[:5]],
        )
        gbps = n * k / 1e3 / timed[0][0] / 1e6 if timed else float("nan")
        print(
            f"  gemv sweep {name:8s} {label:5s}: default {default} "
            f"{out[label]['default_us'] or float('nan'):8.1f} us | best "
            + ", ".join(f"{c} {t:.1f}" for t, c in out[label]["best"][:3])
            + f" ({gbps:.0f} GB/s)",
            flush=True,
        )
    return out


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16,256,4096")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="names of SHAPES, or name=N:K")
    parser.add_argument("--sweep-gemv", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--output")
    args = parser.parse_args()
    DEVICE = args.device
    shapes = {}
    for item in args.shapes.split(","):
        name, _, spec = item.partition("=")
        shapes[name] = tuple(int(v) for v in spec.split(":")) if spec else SHAPES[name]
    rows = [int(r) for r in args.rows.split(",")]
    if DEVICE == "cuda":
        print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    results: dict = {"rows": []}
    for name, (n, k) in shapes.items():
        copies = max(2, -(-L2_ROTATION_BYTES // (n * k))) if DEVICE == "cuda" else 1
        fp8, blocks = weights(n, k, copies, False), weights(n, k, copies, True)
        d_copies = max(2, -(-L2_ROTATION_BYTES // (2 * n * k))) if DEVICE == "cuda" else 1
        dense = [
            w.dequantize(torch.bfloat16 if DEVICE == "cuda" else torch.float32)
            for w in fp8[:d_copies]
        ]
        while len(dense) < d_copies:
            dense.append(dense[-1].clone())
        for m in rows:
            if name == "head" and m > 512:
                continue  # the head only multiplies the last position of each sequence
            row = cell(name, n, k, m, fp8, blocks, dense, results)
            results["rows"].append(row)
            t = row["times_us"]
            bf16 = t.get("bf16", float("nan"))
            parts = " ".join(f"{label} {us:8.1f}" for label, us in t.items())
            gbps = n * k / 1e3 / t["engine"] if "engine" in t else float("nan")
            print(
                f"{name:8s} M={m:5d} | {parts} | engine {gbps:6.0f} GB/s, "
                f"x{t.get('engine', float('nan')) / bf16:.2f} of bf16",
                flush=True,
            )
            for label, err in row.get("errors", {}).items():
                print(f"    !! {label}: {err}", flush=True)
        if args.sweep_gemv:
            results.setdefault("gemv_sweep", {})[name] = sweep_gemv(name, n, k, fp8, blocks)
        del fp8, blocks, dense
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if "block_scaled_mm_refused" in results:
        print("block-wise torch._scaled_mm:", results["block_scaled_mm_refused"])
    one = [r for r in results["rows"] if r["m"] == 1 and "scaled_mm" in r["times_us"]]
    if one:
        print(
            "one row, quant+scaled_mm vs the GEMV (us): "
            + ", ".join(
                f"{r['shape']} {r['times_us'].get('quant+scaled_mm', float('nan')):.1f} vs "
                f"{r['times_us'].get('gemv', float('nan')):.1f}"
                for r in one
            )
        )
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
